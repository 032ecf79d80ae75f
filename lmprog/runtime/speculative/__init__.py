"""Speculative decoding: proposers draft tokens, the engine verifies them in the hybrid batch.

    config   = SpeculativeConfig(method="ngram", num_tokens=8)        # config.py
    proposer = build_proposer(config, vocab_size=..., device=...)     # ngram.py / draft.py
    Speculator(proposer, config, vocab_size=..., device=...)          # speculator.py (engine)

Modules: proposer.py (the Proposer interface), ngram.py (prompt lookup), draft.py (a draft
model), adaptive.py (draft lengths), speculator.py. Verification itself is
lmprog.runtime.engine.step_outputs, with the acceptance rule of lmprog.decoding.rejection; the
scheduler plans verify entries.

What speculation guarantees, against plain decoding of the same request:
- greedy: the same tokens (one caveat: the verify pass computes the logits with an extend
  over k + 1 tokens, plain decoding with a 1-token step; different kernels sum in different
  orders, which can flip a near-tie, as batching can too; seen with random bf16 weights);
- sampling, drafts without a distribution (n-gram): the same tokens for a seeded request
  (each output token consumes one uniform of the request's generator, as in plain decoding),
  and the same distribution for any request;
- sampling, drafts with a distribution (a sampling draft model): the same distribution
  (Leviathan et al.'s rule), not the same tokens for a seed (the rule draws extra uniforms);
- always: stop tokens/strings, EOS, min/max_tokens, constraints and logprobs as in plain
  decoding: accepted tokens go through the request's DecodeState one at a time.
"""

from __future__ import annotations

from typing import Any

from .config import SpeculativeConfig
from .proposer import Proposal, ProposalInput, Proposer

__all__ = ["Proposal", "ProposalInput", "Proposer", "SpeculativeConfig", "build_proposer"]


def build_proposer(
    config: SpeculativeConfig,
    *,
    vocab_size: int,
    device: Any = "cpu",
    dtype: Any = "auto",
    attention: str = "auto",
    max_requests: int | None = None,
    context_length: int | None = None,
) -> Proposer:
    """The proposer `config.method` names, for a target model with `vocab_size` tokens on
    `device` (dtype/attention: how a draft model is loaded, as the target was).
    max_requests, context_length: the engine's max_running_requests and context length, so a
    draft model keeps state for every running request and drafts for sequences of any
    length the engine serves (None: DraftModelProposer's defaults)."""
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"config must be a SpeculativeConfig, got {type(config).__name__}")
    if config.method == "ngram":
        from .ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max)
    # ---- method "draft": the draft-model proposer (lmprog.runtime.speculative.draft) ------
    assert config.method == "draft"
    from .draft import DraftModelProposer

    limits = {
        k: v
        for k, v in (("max_requests", max_requests), ("context_length", context_length))
        if v is not None
    }
    return DraftModelProposer.load(
        config.draft_model,
        vocab_size=vocab_size,
        device=device,
        dtype=dtype,
        load_format=config.draft_load_format,
        attention=attention,
        **limits,
    )
