"""Building a draft-head proposer for a target model: a checkpoint folder, the head shipped
with lmprog for the bundled model, or random weights ("dummy", for tests and benchmarks).
Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from ..models.config import ModelConfig
from .config import SpeculativeConfig
from .eagle import EagleProposer
from .eagle1_files import is_eagle1, load_eagle1
from .head_files import build_eagle3, check_eagle3_target, load_eagle3, load_medusa
from .head_proposer import HeadProposer
from .heads import Eagle3Config, EagleHead, MedusaHeads
from .medusa import MedusaProposer

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

# The EAGLE-3 head trained for the bundled SmolLM2-135M-Instruct (scripts/train_draft_head.py).
BUNDLED_EAGLE3 = Path(__file__).parent / "heads_data" / "eagle3-smollm2-135m-instruct"
DUMMY_SEED = 0
T = TypeVar("T")
DUMMY_MEDUSA_HEADS = 4


def build_head_proposer(
    config: SpeculativeConfig,
    target: LlamaForCausalLM,
    *,
    max_requests: int | None = None,
    context_length: int | None = None,
    embedding: torch.Tensor | None = None,
) -> HeadProposer:
    """The EagleProposer or MedusaProposer `config` names, for `target`. embedding: the
    target's whole token embedding where `target` holds a shard of it (tensor parallelism),
    shared by an EAGLE head without its own (None: the target's)."""
    vocab = target.config.vocab_size
    head: EagleHead
    if config.method == "medusa":
        heads = _medusa(config, target)
        return MedusaProposer(heads, vocab_size=vocab, tree_width=config.tree_width)
    assert config.method == "eagle"
    if config.draft_load_format == "dummy":
        dummy = dummy_eagle3_config(target.config)
        head = _dummy(lambda: build_eagle3(dummy, target, embedding=embedding))
    else:
        head = load_eagle(_eagle_path(config, target), target, embedding=embedding)
    return EagleProposer(
        head,
        capture_layers=head.config.capture_layers(target.config.num_layers),
        vocab_size=vocab,
        tree_width=config.tree_width,
        tree_depth=config.tree_depth,
        max_requests=max_requests or 64,
        context_length=context_length,
    )


def load_eagle(
    folder: str | Path, target: LlamaForCausalLM, *, embedding: torch.Tensor | None = None
) -> EagleHead:
    """The EAGLE head in `folder`, EAGLE-3 or EAGLE-1/2 as its config.json and tensors say
    (eagle1_files.is_eagle1), checked against `target`."""
    if is_eagle1(folder):
        return load_eagle1(folder, target, embedding=embedding)
    return load_eagle3(folder, target, embedding=embedding)


def dummy_eagle3_config(target: ModelConfig, draft_vocab_size: int | None = None) -> Eagle3Config:
    """An EAGLE-3 head shaped for `target`: one layer of its width, heads and MLP size."""
    layer = ModelConfig(
        architecture="llama",
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_layers=1,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        max_position=target.max_position,
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta,
        rope_scaling=target.rope_scaling,
    )
    return Eagle3Config(layer, target.hidden_size, draft_vocab_size or target.vocab_size)


def _eagle_path(config: SpeculativeConfig, target: LlamaForCausalLM) -> Path:
    if config.draft_model is not None:
        return Path(config.draft_model)
    if not (BUNDLED_EAGLE3 / "config.json").is_file():
        raise ValueError(
            "no EAGLE-3 head is installed with lmprog; pass draft_model=<a head's folder> "
            "(or train one: scripts/train_draft_head.py)"
        )
    from .head_files import read_eagle3_config

    try:
        check_eagle3_target(read_eagle3_config(BUNDLED_EAGLE3), target.config, "shipped")
    except ValueError as e:
        raise ValueError(
            f"{e}. The EAGLE-3 head shipped with lmprog is for the bundled "
            "SmolLM2-135M-Instruct; for another model pass draft_model=<its head's folder>"
        ) from None
    return BUNDLED_EAGLE3


def _medusa(config: SpeculativeConfig, target: LlamaForCausalLM) -> MedusaHeads:
    if config.draft_load_format != "dummy":
        assert config.draft_model is not None  # SpeculativeConfig checks
        return load_medusa(config.draft_model, target)
    c = target.config
    param = next(target.parameters())

    def build() -> MedusaHeads:
        return MedusaHeads(c.hidden_size, c.vocab_size, DUMMY_MEDUSA_HEADS, 1)

    return _dummy(build).to(device=param.device, dtype=param.dtype).eval()


def _dummy(build: Callable[[], T]) -> T:
    """Random weights drawn from DUMMY_SEED (the caller's RNG state untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(DUMMY_SEED)
        return build()
