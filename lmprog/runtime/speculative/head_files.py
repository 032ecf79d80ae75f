"""Draft heads on disk, in the layouts SGLang and vLLM read (so a published head loads).
EAGLE-1/2 heads: eagle1_files.py.

EAGLE-3 (SafeAILab/EAGLE, SpecForge; SGLang's llama_eagle3.py, vLLM's llama_eagle3.py):
a folder with config.json (architectures ["LlamaForCausalLMEagle3"], a Llama config of one
layer, draft_vocab_size, optional target_hidden_size and
eagle_config.eagle_aux_hidden_state_layer_ids) and *.safetensors or pytorch_model.bin:

    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight
    midlayer.self_attn.{q,k,v,o}_proj.weight   (q/k/v take 2 x hidden: [embedding, hidden])
    midlayer.mlp.{gate,up,down}_proj.weight
    fc.weight [hidden, 3 x target_hidden]   norm.weight   lm_head.weight [draft_vocab, hidden]
    d2t [draft_vocab] (target id = draft id + d2t)   t2d [vocab] bool   (embed_tokens.weight)

Medusa (FasterDecoding/Medusa): medusa_lm_head.safetensors or medusa_lm_head.pt with
`medusa_head.{i}.{j}.linear.{weight,bias}` (block j of head i) and `medusa_head.{i}.{L}.weight`
(its vocabulary projection; the .pt may omit the `medusa_head.` prefix), config.json with
medusa_num_heads / medusa_num_layers; vLLM's converted layout (`blocks.{i}.layers.{j}.weight`,
`lm_heads.{i}.weight`) is read too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..models.config import ModelConfig, config_from_hf
from .heads import Eagle3Config, Eagle3Head, EagleHead, MedusaHeads

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
EAGLE1_ARCHITECTURES = ("LlamaForCausalLMEagle", "EagleLlamaForCausalLM", "EAGLEModel")
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}  # fmt: skip


# ---- EAGLE-3 -----------------------------------------------------------------------------
def read_eagle3_config(folder: str | Path) -> Eagle3Config:
    """The head's shape from its config.json (ValueError naming what is wrong)."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ValueError(f"{folder}: no config.json; an EAGLE head is a folder with one")
    cfg = json.loads((path / "config.json").read_text())
    archs = cfg.get("architectures") or []
    if not any(a in EAGLE3_ARCHITECTURES for a in archs):
        raise ValueError(
            f"{folder}: architectures {archs} is not an EAGLE-3 head "
            f"(expected one of {list(EAGLE3_ARCHITECTURES)}) nor an EAGLE-1/2 head "
            f"(one of {list(EAGLE1_ARCHITECTURES)}, or LlamaForCausalLM with fc.weight and "
            "layers.0.*)"
        )
    if cfg.get("num_hidden_layers", 1) != 1:
        raise ValueError(
            f"{folder}: EAGLE-3 heads of {cfg['num_hidden_layers']} layers are not supported (1)"
        )
    if cfg.get("tie_word_embeddings"):
        raise ValueError(f"{folder}: an EAGLE-3 head with tied embeddings is not supported")
    layer = config_from_hf({**cfg, "model_type": "llama", "num_hidden_layers": 1})
    eagle = cfg.get("eagle_config") or {}
    aux = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get(
        "eagle_aux_hidden_state_layer_ids"
    )
    return Eagle3Config(
        layer=layer,
        target_hidden_size=int(cfg.get("target_hidden_size") or layer.hidden_size),
        draft_vocab_size=int(cfg.get("draft_vocab_size") or layer.vocab_size),
        aux_layer_ids=None if not aux else tuple(int(i) for i in aux),
        has_embedding=any(n.endswith("embed_tokens.weight") for n in _names(path)),
    )


def load_eagle3(
    folder: str | Path,
    target: LlamaForCausalLM,
    *,
    dtype: torch.dtype | None = None,
    embedding: torch.Tensor | None = None,
) -> Eagle3Head:
    """An EAGLE-3 head for `target` (its device, dtype and attention backend), checked
    against it: hidden size, vocabulary, layers read. embedding: as build_eagle3's."""
    config = read_eagle3_config(folder)
    check_eagle3_target(config, target.config, str(folder))
    head = build_eagle3(config, target, dtype=dtype, embedding=embedding)
    load_eagle3_weights(head, _weights(Path(folder)), str(folder))
    return head


def check_eagle3_target(config: Eagle3Config, target: ModelConfig, what: str) -> None:
    if config.target_hidden_size != target.hidden_size:
        raise ValueError(
            f"the EAGLE-3 head {what} reads hidden states of {config.target_hidden_size} "
            f"features but the target model's are {target.hidden_size}: it was trained for "
            "another model"
        )
    if config.layer.vocab_size != target.vocab_size:
        raise ValueError(
            f"the EAGLE-3 head {what} has a vocabulary of {config.layer.vocab_size} tokens, "
            f"the target model {target.vocab_size}: it was trained for another tokenizer"
        )
    config.capture_layers(target.num_layers)  # raises for layers the target lacks


def build_eagle3(
    config: Eagle3Config,
    target: LlamaForCausalLM,
    *,
    dtype: torch.dtype | None = None,
    embedding: torch.Tensor | None = None,
) -> Eagle3Head:
    """A head of `config` on target's device (random weights), with an attention backend
    of the target's kind; the target's embedding shared unless the head has its own.
    embedding: the target's whole table where `target` holds a shard of it (tensor
    parallelism: its rows gathered from every rank); None: target's own."""
    param = next(target.parameters())
    c = config.layer
    attention = type(target.attention)(c.num_heads, c.num_kv_heads, c.head_dim, param.device)
    head = Eagle3Head(config, attention).to(device=param.device, dtype=dtype or param.dtype)
    if head.embed_tokens is None:
        head.share_embedding(target.model.embed_tokens.weight if embedding is None else embedding)
    return head.eval()


def load_eagle3_weights(
    head: Eagle3Head, weights: Iterable[tuple[str, torch.Tensor]], what: str = "checkpoint"
) -> None:
    """Copy checkpoint tensors (published names) into `head`; raise on missing/unknown ones."""
    copy_head_weights(head, weights, what, "an EAGLE-3 head", optional={"t2d"})  # t2d: training
    c, d2t = head.config.layer, head.d2t
    ids = d2t + torch.arange(len(d2t), device=d2t.device)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size):
        raise ValueError(f"{what}: d2t maps draft ids outside the target's {c.vocab_size} tokens")


def copy_head_weights(
    head: EagleHead,
    weights: Iterable[tuple[str, torch.Tensor]],
    what: str,
    kind: str,
    optional: set[str] | None = None,
) -> None:
    """Copy checkpoint tensors (published names: q/k/v and gate/up unfused, an optional
    `model.` prefix) into `head`'s parameters and buffers; raise naming the tensors that are
    missing (but `optional`), unknown, or of another shape than the head's config gives."""
    params = {**dict(head.named_parameters()), **dict(head.named_buffers())}
    c = head.config.layer
    bounds = {
        "qkv_proj": [0, c.q_size, c.q_size + c.kv_size, c.q_size + 2 * c.kv_size],
        "gate_up_proj": [0, c.intermediate_size, 2 * c.intermediate_size],
    }
    missing = {(n, s) for n in params for s in range(_shards(n)) if n not in (optional or ())}
    for name, tensor in weights:
        name = name.removeprefix("model.")
        target, shard = _fused_name(name)
        if target not in params:
            raise ValueError(f"{what}: tensor {name!r} has no place in {kind}")
        dst = params[target].data
        fused = target.split(".")[-2] if "." in target else ""
        if fused in bounds:
            dst = dst[bounds[fused][shard] : bounds[fused][shard + 1]]
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{what}: {name} is {tuple(tensor.shape)}, the head's config says "
                f"{tuple(dst.shape)}"
            )
        with torch.no_grad():
            dst.copy_(tensor.to(dst.dtype) if dst.dtype != torch.bool else tensor.bool())
        missing.discard((target, shard))
    if missing:
        names = sorted(_published_name(n, shard) for n, shard in missing)
        raise ValueError(f"{what}: the checkpoint of {kind} lacks {names}")


def save_eagle3(head: Eagle3Head, folder: str | Path, **extra: Any) -> None:
    """Write `head` in the published layout (config.json + model.safetensors, q/k/v and
    gate/up unfused, no embedding unless the head has its own); extra: config keys."""
    from safetensors.torch import save_file

    c, cfg = head.config.layer, head.config
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        **extra,
    }
    if cfg.aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors: dict[str, torch.Tensor] = {}
    for name, t in [*head.named_parameters(), *head.named_buffers()]:
        tensors.update(_unfused(name, t.detach().cpu().contiguous(), c))
    save_file(tensors, str(out / "model.safetensors"))


# ---- Medusa ------------------------------------------------------------------------------
_MEDUSA = re.compile(r"^(\d+)\.(\d+)\.(linear\.)?(weight|bias)$")
_VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_HEAD = re.compile(r"^lm_heads\.(\d+)\.weight$")


def load_medusa(
    path: str | Path, target: LlamaForCausalLM, *, dtype: torch.dtype | None = None
) -> MedusaHeads:
    """Medusa heads for `target` from a folder (or one weights file), checked against it."""
    weights = medusa_state(path)
    heads, layers, bias, hidden, vocab = _medusa_shape(weights, str(path))
    tc = target.config
    if hidden != tc.hidden_size:
        raise ValueError(
            f"the Medusa heads {path} read hidden states of {hidden} features but the "
            f"target model's are {tc.hidden_size}: they were trained for another model"
        )
    if vocab != tc.vocab_size:
        raise ValueError(
            f"the Medusa heads {path} predict {vocab} tokens, the target model has "
            f"{tc.vocab_size}: they were trained for another tokenizer"
        )
    param = next(target.parameters())
    module = MedusaHeads(hidden, vocab, heads, layers, bias)
    module.load_state_dict(weights, strict=True)
    return module.to(device=param.device, dtype=dtype or param.dtype).eval()


def medusa_state(path: str | Path) -> dict[str, torch.Tensor]:
    """A Medusa checkpoint's tensors under MedusaHeads' names (`medusa_head.i.j...`)."""
    p = Path(path)
    if p.is_dir():
        found = [p / f for f in MEDUSA_FILES if (p / f).is_file()]
        found = found or sorted(p.glob("*.safetensors"))
        if not found:
            raise ValueError(f"{path}: no {' or '.join(MEDUSA_FILES)} (nor *.safetensors)")
        p = found[0]
    raw = dict(_read_file(p))
    layers = _vllm_layers(raw)
    state: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        name = name.removeprefix("medusa_head.").removeprefix("medusa_heads.")
        if name == "token_map":
            raise ValueError(f"{path}: Medusa heads over a truncated vocabulary are not supported")
        if m := _VLLM_BLOCK.match(name):
            name = f"{m[1]}.{m[2]}.linear.{m[3]}"
        elif m := _VLLM_HEAD.match(name):
            name = f"{m[1]}.{layers}.weight"
        elif (m := _MEDUSA.match(name)) and not m[3]:
            name = f"{m[1]}.{m[2]}.{m[4]}"
        if not _MEDUSA.match(name):
            raise ValueError(f"{path}: tensor {name!r} is not part of Medusa heads")
        state["medusa_head." + name] = t
    return state


def save_medusa(heads: MedusaHeads, folder: str | Path) -> None:
    """config.json + medusa_lm_head.safetensors, as FasterDecoding/Medusa writes them."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().cpu().contiguous() for k, v in heads.state_dict().items()}
    save_file(state, str(out / "medusa_lm_head.safetensors"))


def _medusa_shape(state: dict[str, torch.Tensor], what: str) -> tuple[int, int, bool, int, int]:
    """(heads, layers, bias, hidden, vocab) from the tensor names and shapes."""
    keys = [_MEDUSA.match(k.removeprefix("medusa_head.")) for k in state]
    idx = [(int(m[1]), int(m[2])) for m in keys if m]
    if not idx:
        raise ValueError(f"{what}: no Medusa head tensors")
    heads = max(i for i, _ in idx) + 1
    layers = max(j for _, j in idx)
    final = state.get(f"medusa_head.0.{layers}.weight")
    if final is None or final.dim() != 2:
        raise ValueError(f"{what}: head 0 has no vocabulary projection medusa_head.0.{layers}")
    bias = "medusa_head.0.0.linear.bias" in state if layers else True
    vocab, hidden = final.shape
    return heads, layers, bias, int(hidden), int(vocab)


def _vllm_layers(raw: dict[str, torch.Tensor]) -> int:
    """Residual blocks per head in vLLM's converted layout (0 when not that layout)."""
    blocks = [int(m[2]) for n in raw if (m := _VLLM_BLOCK.match(n.removeprefix("medusa_heads.")))]
    return max(blocks) + 1 if blocks else 0


# ---- files -------------------------------------------------------------------------------
def _names(folder: Path) -> list[str]:
    """The tensor names of a checkpoint folder (safetensors: without reading the tensors)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return [name for name, _ in _weights(folder)]
    from safetensors import safe_open

    names: list[str] = []
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            names += list(handle.keys())
    return names


def _weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors or pytorch_model.bin")
    for f in files:
        yield from _read_file(f)


def _read_file(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        yield from load_file(str(path)).items()
    else:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise ValueError(f"{path}: not a state dict")
        yield from state.items()


def _fused_name(name: str) -> tuple[str, int]:
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _FUSED:
            fused, shard = _FUSED[part]
            return ".".join(parts[:i] + [fused] + parts[i + 1 :]), shard
    return name, 0


def _published_name(name: str, shard: int) -> str:
    """A fused parameter's shard under its checkpoint name (qkv_proj shard 1: k_proj)."""
    for part, (fused, i) in _FUSED.items():
        if i == shard and f".{fused}." in name:
            return name.replace(fused, part)
    return name


def _shards(name: str) -> int:
    return 3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 1


def _unfused(name: str, t: torch.Tensor, c: ModelConfig) -> dict[str, torch.Tensor]:
    if ".qkv_proj." in name:
        q, k, v = t.split([c.q_size, c.kv_size, c.kv_size])
        return {name.replace("qkv_proj", p): x.contiguous() for p, x in
                (("q_proj", q), ("k_proj", k), ("v_proj", v))}  # fmt: skip
    if ".gate_up_proj." in name:
        g, u = t.chunk(2)
        return {name.replace("gate_up_proj", "gate_proj"): g.contiguous(),
                name.replace("gate_up_proj", "up_proj"): u.contiguous()}  # fmt: skip
    return {name: t}
