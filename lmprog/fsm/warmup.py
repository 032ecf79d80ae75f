"""A tokenizer's constraint set-up, started when a backend is built instead of waited for by
its first constrained request.

A first constraint over a vocabulary needs the vocabulary's bytes (`TokenVocab`: a few ms
from the disk cache) and llguidance's `LLTokenizer` (~0.1-0.2 s for 49k tokens: the token
trie and the slices that make masks fast), and the apply's compiled select (`mask_kernel`:
~0.3 s the first time on a machine, then loaded). `start(tokenizer)` builds them on a daemon
thread; the LLTokenizer is built in Rust with the GIL released, so the thread barely
competes with the caller's Python. A constrained request that comes before it is done
waits for that one build (`index.ll_tokenizer_for` builds once per vocabulary).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from lmprog.fsm.mask_kernel import kernel
from lmprog.fsm.vocab import TokenVocab

_log = logging.getLogger(__name__)


def start(tokenizer: Any) -> threading.Thread:
    """Start building `tokenizer`'s constraint vocabulary on a daemon thread (returned).
    Errors are left for the first constrained request to raise."""
    thread = threading.Thread(
        target=_build, args=(tokenizer,), name="lmprog-constraint-setup", daemon=True
    )
    thread.start()
    return thread


def _build(tokenizer: Any) -> None:
    try:
        from lmprog.fsm.index import ll_tokenizer_for

        ll_tokenizer_for(TokenVocab.from_tokenizer(tokenizer), tokenizer)
    except Exception as exc:  # noqa: BLE001 - the first constrained request reports it
        _log.debug("constraint set-up for %r failed: %s", tokenizer, exc)
    kernel()  # the host's mask apply, compiled once per user (~0.3 s) or loaded (never raises)
