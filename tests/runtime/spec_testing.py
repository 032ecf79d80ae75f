"""Shared by the speculative-decoding tests (test_spec_*.py): oracle proposers that draft a
known continuation with deliberate mistakes (chains; trees whose true branch is not the first),
a skip mark for tests that need the bundled
default model (random-weight tiny models: engine_testing.random_llama), and the tiny target
and prompts of the draft-head tests (test_spec_heads.py, test_spec_eagle1.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import save_file

from lmprog.core.models import BUNDLED_MODELS, DEFAULT_MODEL
from lmprog.runtime.models import ModelConfig
from lmprog.runtime.speculative import Proposal, Proposer

_PACKAGE, _, _INSTALL = BUNDLED_MODELS[DEFAULT_MODEL]
requires_default_model = pytest.mark.skipif(
    importlib.util.find_spec(_PACKAGE) is None,
    reason=f"the default model's package {_PACKAGE!r} is not installed ({_INSTALL})",
)

HEAD_TARGET = ModelConfig(
    "llama",
    vocab_size=211,
    hidden_size=32,
    intermediate_size=64,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position=160,
)
HEAD_PROMPTS = [[5, 17, 3, 99, 42, 7], [1, 2, 3], [200, 10, 10, 10, 4, 8, 15, 16, 23, 42], [77, 5]]


# ---- EAGLE-1/2 heads in the published layout (test_spec_eagle1.py, test_spec_heads.py) ------
def published(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The published tensors and their shapes for a target of config c
    (yuhuili/EAGLE-LLaMA3-Instruct-8B: hidden 4096, MLP 14336, 32 x 128 q, 8 x 128 k/v)."""
    h, m, q, kv = c.hidden_size, c.intermediate_size, c.q_size, c.kv_size
    return {
        "fc.weight": (h, 2 * h), "fc.bias": (h,),
        "layers.0.self_attn.q_proj.weight": (q, h), "layers.0.self_attn.k_proj.weight": (kv, h),
        "layers.0.self_attn.v_proj.weight": (kv, h), "layers.0.self_attn.o_proj.weight": (h, q),
        "layers.0.mlp.gate_proj.weight": (m, h), "layers.0.mlp.up_proj.weight": (m, h),
        "layers.0.mlp.down_proj.weight": (h, m),
        "layers.0.input_layernorm.weight": (h,), "layers.0.post_attention_layernorm.weight": (h,),
        "embed_tokens.weight": (c.vocab_size, h),
    }  # fmt: skip


def published_state(seed=1, std=0.3, c=HEAD_TARGET):
    g = torch.Generator().manual_seed(seed)
    state = {n: torch.randn(s, generator=g) * std for n, s in published(c).items()}
    norm = 1.0 + 0.3 * torch.randn(c.hidden_size, generator=g)
    state["layers.0.post_attention_layernorm.weight"] = norm
    return state


def write_head(
    folder, state, *, arch="LlamaForCausalLM", fmt="bin", prefix="", c=HEAD_TARGET, **config
):
    """A head folder as SafeAILab/EAGLE publishes it (config.json + pytorch_model.bin)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": [arch], "model_type": "llama", "bias": "fc.bias" in state,
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": 1, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "vocab_size": c.vocab_size, "hidden_act": "silu",
        "tie_word_embeddings": False, **config,
    }  # fmt: skip
    if arch == "EAGLEModel":  # vLLM's older EAGLEConfig: the Llama config under "model"
        cfg = {"architectures": [arch], "model_type": "eagle", "model": cfg}
    (folder / "config.json").write_text(json.dumps(cfg))
    named = {prefix + k: v.contiguous() for k, v in state.items()}
    if fmt == "bin":
        torch.save(named, folder / "pytorch_model.bin")
    else:
        save_file(named, str(folder / "model.safetensors"))
    return folder


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


class TreeOracle(Proposer):
    """Knows continuations (learnt from plain runs); proposes a tree with the true
    continuation on its second branch (behind a wrong one) and a wrong sibling beneath."""

    def __init__(self, vocab_size):
        self.v, self.known, self.released = vocab_size, [], set()

    def learn(self, prompts, results):
        self.known += [list(p) + list(r.token_ids) for p, r in zip(prompts, results)]

    def propose(self, inputs):
        out = []
        for inp in inputs:
            seq = list(inp.token_ids)
            full = next((k for k in self.known if k[: len(seq)] == seq and len(k) > len(seq)), [])
            chain = full[len(seq) : len(seq) + max(0, inp.max_tokens - 2)]
            if not chain:
                out.append(Proposal(()))
                continue
            ids = [(chain[0] + 1) % self.v] + chain + [(chain[0] + 7) % self.v]
            parents = [-1] + [-1] + list(range(1, len(chain))) + [1]
            out.append(Proposal(tuple(ids), parents=tuple(parents)))
        return out

    def release(self, rid):
        self.released.add(rid)
