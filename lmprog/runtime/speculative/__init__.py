"""Speculative decoding: proposers draft tokens, the engine verifies them in the hybrid batch.

    config   = SpeculativeConfig(method="ngram", num_tokens=8)        # config.py
    proposer = build_proposer(config, vocab_size=..., device=...)     # ngram.py / draft.py /
                                                 # eagle.py / medusa.py (heads: target=model)
    Speculator(proposer, config, vocab_size=..., device=...)          # speculator.py (engine)

Greedy outputs are the same as without speculation, sampled ones keep their distribution
(seeded n-gram runs their tokens too). Design and guarantees: docs/design/speculative.md.
"""

from __future__ import annotations

from typing import Any

from .config import SpeculativeConfig
from .draft import DraftModelProposer
from .ngram import NgramProposer
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
    target: Any = None,
    target_embedding: Any = None,
) -> Proposer:
    """The proposer `config.method` names, for a target model with `vocab_size` tokens on
    `device` (dtype/attention: how a draft model is loaded, as the target was).
    max_requests, context_length: the engine's max_running_requests and context length, so a
    draft model keeps state for every running request and drafts for sequences of any
    length the engine serves (None: DraftModelProposer's defaults). target: the target
    model (a runtime LlamaForCausalLM), which draft heads ("eagle", "medusa") read;
    target_embedding: its whole token embedding where target holds a shard of it (tensor
    parallelism: lmprog.runtime.parallel.sharding.gather_embedding), for an EAGLE head."""
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"config must be a SpeculativeConfig, got {type(config).__name__}")
    if config.method == "ngram":
        return NgramProposer(config.ngram_min, config.ngram_max, config.ngram_branches)
    if config.method in ("eagle", "medusa"):
        from .head_build import build_head_proposer

        if target is None:
            raise ValueError(f"speculative method {config.method!r} needs the target model")
        return build_head_proposer(
            config,
            target,
            max_requests=max_requests,
            context_length=context_length,
            embedding=target_embedding,
        )
    # ---- method "draft": the draft-model proposer (lmprog.runtime.speculative.draft) ------
    assert config.method == "draft"

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
