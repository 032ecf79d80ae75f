"""The constraint set-up a backend starts when it is built: one LLTokenizer per vocabulary,
which a request arriving during the build waits for instead of building its own."""

from __future__ import annotations

import threading

import llguidance
from fsm_toys import byte_level_tokenizer

from lmprog.fsm import index as index_mod
from lmprog.fsm import warmup
from lmprog.fsm.vocab import TokenVocab


def test_a_request_during_the_warm_up_waits_for_its_build(monkeypatch):
    tok = byte_level_tokenizer()
    built, native, release = [], [], threading.Event()
    real = llguidance.LLTokenizer

    def slow_build(*args, **kwargs):
        release.wait(5)
        if isinstance(args[0], str):  # llguidance's own tokenizer, tried first (the toy's
            native.append(real(*args, **kwargs))  # byte 0xff it cannot spell: not kept)
            return native[-1]
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(llguidance, "LLTokenizer", slow_build)
    thread = warmup.start(tok)
    got = []
    request = threading.Thread(
        target=lambda: got.append(index_mod.ll_tokenizer_for(TokenVocab.from_tokenizer(tok), tok))
    )
    request.start()
    release.set()
    thread.join(5)
    request.join(5)
    assert len(built) == 1 and got == built and len(native) == 1


def test_a_failing_warm_up_is_silent():
    class NotATokenizer:
        pass

    warmup.start(NotATokenizer()).join(5)  # the first constrained request reports it
