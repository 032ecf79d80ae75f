"""The engine's per-step fast paths agree with the general code they shortcut (issue 5):
ScheduledBatch's arrays built from columns against their per-entry definitions, a step
without drafts (StepOutputs._decode) against the verify chains it skips, and DecodeState's
arming of stop strings once min_tokens is reached."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.runtime.config import SchedulerConfig
from lmprog.runtime.engine.step_outputs import StepOutputs, _chain
from lmprog.runtime.request import Req, ReqOutputs
from lmprog.runtime.scheduler import Scheduler
from lmprog.runtime.scheduler.batch import ScheduledBatch, ScheduledEntry

VOCAB, EOS = 64, (2,)


class _Tokens:
    def __init__(self, token_ids):
        self.token_ids = token_ids


def _random_batch(rng: random.Random) -> ScheduledBatch:
    entries, positions, offset = [], [], 0
    for row in range(rng.randint(0, 7)):
        n = rng.choice([1, 1, 1, rng.randint(2, 6)])
        start = rng.randint(0, 20)
        k = rng.randint(0, n - 1) if rng.random() < 0.3 else 0  # verify drafts
        logits_from = None if rng.random() < 0.25 else rng.randint(start, start + n - 1)
        req = _Tokens([rng.randrange(1000) for _ in range(start + n + 3)])
        drafts = tuple(rng.randrange(1000) for _ in range(k))
        entries.append(
            ScheduledEntry(
                req, row * 3, start, n, offset, logits_from, logits_from is not None, False, drafts
            )
        )
        positions += range(start, start + n)
        offset += n
    return ScheduledBatch(
        tuple(entries),
        np.arange(1, offset + 1, dtype=np.int32),
        np.array(positions, dtype=np.int64),
    )


def test_batch_arrays_equal_their_per_entry_definitions():
    rng = random.Random(0)
    for _ in range(500):
        b = _random_batch(rng)
        es = b.entries
        wanted = [
            np.arange(e.offset + e.logits_from - e.start, e.offset + e.num_new)
            for e in es
            if e.logits_from is not None
        ]
        expected = {
            "rows": [e.row for e in es],
            "seq_lens": [e.end for e in es],
            "extend_lens": [e.num_new for e in es],
            "input_ids": [t for e in es for t in e.input_ids()],
            "logits_indices": np.concatenate(wanted).tolist() if wanted else [],
        }
        for name, values in expected.items():
            got = getattr(b, name)()
            assert got.dtype == np.int64 and got.tolist() == values, name
        assert b.num_decodes == sum(e.num_new == 1 for e in es)


class _Faulty(DecodeState):
    """A request whose third token fails in accept (its fault must stay its own)."""

    def accept(self, token, *args):
        if len(self.output_ids) == 2:
            raise RuntimeError("boom")
        return super().accept(token, *args)


def _engine_parts():
    sched = Scheduler(
        4096, 256, SchedulerConfig(max_num_batched_tokens=512, max_running_requests=16)
    )
    params = [
        SP(max_tokens=9, temperature=0.0, ignore_eos=True),
        SP(max_tokens=7, temperature=0.8, seed=3),
        SP(max_tokens=9, temperature=1.0, top_k=5),  # torch's default RNG
        SP(max_tokens=4, temperature=0.0, ignore_eos=True),
        SP(max_tokens=9, temperature=0.0, stop_token_ids=(7, 11, 13, 17, 19, 23)),
        SP(max_tokens=9, temperature=0.7, frequency_penalty=0.5, min_tokens=3, seed=5),
        SP(max_tokens=9, temperature=0.0, return_logprob=True, top_logprobs_num=2),
    ]
    for i, p in enumerate(params + [params[0]]):
        prompt = [3 + i, 4 + i, 5, 6 + i]
        cls = _Faulty if i == len(params) else DecodeState
        req = Req(i, prompt, p, prompt_logprob_start=1 if i == 2 else None)
        req.engine_data = cls(
            p,
            tokenizer=None,
            prompt_ids=prompt,
            eos_token_ids=EOS,
            vocab_size=VOCAB,
            token_text=str,
            prompt_logprob_start=1 if i == 2 else None,
            outputs=ReqOutputs(req),
        )
        sched.submit(req)
    return sched


class _AlwaysVerify(StepOutputs):
    """Hands every step to the verify chains, as before the fast path existed."""

    def _decode(self, entries, logits, sampling, states, result):
        self._verify(entries, logits, [_chain(entries[i], i, r, None) for i, r in sampling], result)


def _run(outputs_cls) -> list:
    torch.manual_seed(0)
    sched, outputs = _engine_parts(), outputs_cls(BatchSampler(EOS))
    g, trace = torch.Generator().manual_seed(1), []
    while sched.has_work:
        batch = sched.schedule()
        logits = torch.randn(len(batch.logits_indices()), VOCAB, generator=g) * 3
        out = outputs.process(batch, logits)
        trace.append((out.tokens, out.reasons, out.num_sampled))
        sched.process_results(batch, out.reasons)
    return trace


def test_a_step_without_drafts_takes_tokens_as_the_verify_chains_do():
    fast, general = _run(StepOutputs), _run(_AlwaysVerify)
    assert fast == general
    reasons = [r for _, step_reasons, _ in fast for r in step_reasons if r is not None]
    assert "error" in reasons and "stop" in reasons  # the faulty request, a stop token


class _Pieces:
    """Token i decodes to PIECES[i] (a toy tokenizer)."""

    PIECES = ["<eos>", "Hel", "lo", "!", " w"]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(self.PIECES[i] for i in ids if not (skip_special_tokens and i == 0))


@pytest.mark.parametrize("min_tokens, text, matched", [(0, "Hel", "lo"), (3, "Hello!", "lo")])
def test_stop_strings_count_only_from_min_tokens_on(min_tokens, text, matched):
    state = DecodeState(
        SP(max_tokens=10, stop=["lo"], min_tokens=min_tokens),
        tokenizer=_Pieces(),
        prompt_ids=[1],
        eos_token_ids=(0,),
        vocab_size=5,
        token_text=str,
    )
    for token in (1, 2, 3, 2, 3):
        if state.done:
            break
        state.accept(token)
    assert state.done and state.text == text and state.matched_stop == matched
