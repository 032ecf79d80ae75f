"""Shared by the speculative-decoding tests (test_spec_*.py): an oracle proposer that drafts a
known continuation with deliberate mistakes, and a skip mark for tests that need the bundled
default model (random-weight tiny models: engine_testing.random_llama)."""

from __future__ import annotations

import importlib.util

import pytest

from lmprog.core.models import BUNDLED_MODELS, DEFAULT_MODEL
from lmprog.runtime.speculative import Proposal, Proposer

_PACKAGE, _, _INSTALL = BUNDLED_MODELS[DEFAULT_MODEL]
requires_default_model = pytest.mark.skipif(
    importlib.util.find_spec(_PACKAGE) is None,
    reason=f"the default model's package {_PACKAGE!r} is not installed ({_INSTALL})",
)


class Oracle(Proposer):
    """Drafts the known continuation of a sequence (learnt from spec-off runs), its last
    token wrong in every third call; nothing for a sequence it does not know."""

    def __init__(self, vocab_size: int, known: list[list[int]] | None = None) -> None:
        self.vocab_size = vocab_size
        self.known: list[list[int]] = list(known or [])
        self.calls = 0
        self.released: set = set()

    def learn(self, prompts, results) -> None:
        self.known += [list(p) + list(r.token_ids) for p, r in zip(prompts, results)]

    def propose(self, inputs):
        out = []
        for inp in inputs:
            self.calls += 1
            seq = list(inp.token_ids)
            assert min(seq) >= 0, "a proposer was shown a placeholder (overlap scheduling)"
            full = next((k for k in self.known if k[: len(seq)] == seq and len(k) > len(seq)), None)
            chain = full[len(seq) : len(seq) + inp.max_tokens] if full else []
            if chain and self.calls % 3 == 0:
                chain[-1] = (chain[-1] + 1) % self.vocab_size
            out.append(Proposal(tuple(chain)))
        return out

    def release(self, rid):
        self.released.add(rid)
