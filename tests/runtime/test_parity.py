"""Logits parity with transformers' own implementations of the same weights.

Tiny random configs (Llama with llama3 RoPE, tied and untied, Qwen2 qkv bias, Qwen3 q/k norm),
saved as safetensors folders and as a GGUF, loaded through our loaders; and (e2e) the default
SmolLM2-135M GGUF. Each checks a full prefill, a chunked prefill over a cached prefix, decode
steps through the paged pool, and a hybrid batch of requests of different lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import load_model

torch.set_num_threads(1)
FP32_ATOL = 1e-4  # tiny random models, logits of magnitude ~1-10
DEFAULT_MODEL_ATOL = 2e-3  # SmolLM2-135M, logits up to ~35 (measured max diff ~6e-5)


class PagedRunner:
    """Drives a model through the pool like the engine will: random, scattered slots."""

    def __init__(self, model, num_slots=600, max_reqs=6, max_len=160, seed=0):
        weight = next(model.parameters())
        self.model = model
        self.kv = KVPool.for_model(model.config, num_slots, weight.dtype, weight.device)
        self.req_to_token = torch.zeros(max_reqs, max_len, dtype=torch.int32)
        g = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(num_slots, generator=g) + 1).tolist()
        self.lens = [0] * max_reqs

    def step(self, work: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """work: (request row, new token ids); returns each request's logits [n_new, vocab]."""
        locs, ids = [], []
        for row, new in work:
            slots = [self.free.pop() for _ in new]
            self.req_to_token[row, self.lens[row] : self.lens[row] + len(new)] = torch.tensor(slots)
            self.lens[row] += len(new)
            locs += slots
            ids += new
        batch = ForwardBatch.build(
            input_ids=ids,
            out_cache_loc=locs,
            req_pool_indices=[r for r, _ in work],
            seq_lens=[self.lens[r] for r, _ in work],
            extend_lens=[len(n) for _, n in work],
            req_to_token=self.req_to_token,
            logits_indices=range(len(ids)),
            device=self.kv.device,
        )
        with torch.inference_mode():
            logits = self.model(batch, self.kv).cpu()
        return list(logits.split([len(n) for _, n in work]))


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([ids], device=hf_model.device)).logits[0].float().cpu()


def check_paged_parity(ours, hf_model, seqs: list[list[int]], atol: float) -> float:
    """Prefill, chunked prefill over a cached prefix, decode steps and one hybrid batch; returns
    the largest |ours - transformers| seen."""
    refs = [hf_logits(hf_model, s) for s in seqs]
    worst = 0.0

    def compare(got: torch.Tensor, want: torch.Tensor) -> None:
        nonlocal worst
        worst = max(worst, (got - want).abs().max().item())
        torch.testing.assert_close(got, want, atol=atol, rtol=0)

    a, b = seqs[0], seqs[1]
    runner = PagedRunner(ours)
    (full,) = runner.step([(0, a)])  # whole prompt at once
    compare(full, refs[0])
    runner = PagedRunner(ours, seed=1)
    cut = len(b) // 3
    (first,) = runner.step([(2, b[:cut])])  # chunk 1
    (second,) = runner.step([(2, b[cut:-3])])  # chunk 2 attends to chunk 1's cached slots
    compare(torch.cat([first, second]), refs[1][:-3])
    for i in range(3, 0, -1):  # decode steps
        (tok,) = runner.step([(2, [b[-i]])])
        compare(tok, refs[1][-i : len(b) - i + 1])
    # hybrid: fresh prefill + chunk over a prefix + two decodes of other lengths
    hybrid = PagedRunner(ours, seed=2)
    c, d = seqs[2], seqs[3]
    hybrid.step([(1, b[:-1]), (3, c[:5]), (4, d[:-1])])
    got = hybrid.step([(0, a), (3, c[5:]), (1, [b[-1]]), (4, [d[-1]])])
    compare(got[0], refs[0])
    compare(got[1], refs[2][5:])
    compare(got[2], refs[1][-1:])
    compare(got[3], refs[3][-1:])
    return worst


# ------------------------------------------------------------------ tiny random configs


def randomize_hf(model, std: float = 0.3, seed: int = 0, norm_center: float = 1.0):
    """Random weights for a transformers model, large enough (std 0.3) that attention and
    routing are far from uniform (0.1: generations repeat tokens): matrices N(0, std),
    vectors N(0, 0.5), norm weights norm_center + N(0, 0.3) (Gemma's norms scale by 1 + w:
    centre 0). Returns it in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm_center + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (std if p.dim() > 1 else 0.5))
    return model.eval()


def _hf_tiny(kind: str, tie: bool):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=120,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
    )
    if kind == "llama3":
        rope = {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 10000.0,
        }
        model = LlamaForCausalLM(LlamaConfig(rope_parameters=rope, **common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    return randomize_hf(model)


def _seqs(vocab: int, lengths=(11, 19, 9, 14)) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize(
    "kind,tie", [("llama3", False), ("llama3", True), ("qwen2", True), ("qwen3", False)]
)
def test_tiny_safetensors_models_match_transformers(kind, tie, tmp_path):
    hf = _hf_tiny(kind, tie)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert ours.config.tie_word_embeddings == tie
    assert ours.config.attention_bias == (kind == "qwen2")
    assert ours.config.qk_norm == (kind == "qwen3")
    check_paged_parity(ours, hf, _seqs(120), FP32_ATOL)


def test_tiny_model_in_bf16_matches_transformers_bf16(tmp_path):
    hf = _hf_tiny("qwen2", tie=False)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="bfloat16")
    seq = _seqs(120)[1]
    (got,) = PagedRunner(ours).step([(0, seq)])
    want = hf_logits(hf.to(torch.bfloat16), seq)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() < 0.05 * scale
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


def _write_tiny_gguf(hf, path) -> None:
    """A llama-arch GGUF the way llama.cpp's converter writes one: Q/K rows permuted for
    pair-wise RoPE, 2-D weights Q8_0-quantized, norms F32."""
    import gguf

    cfg = hf.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    block = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, p in hf.state_dict().items():
        array = p.float().numpy()
        if name.startswith("model.layers."):
            _, _, layer, *rest = name.split(".")
            name = f"blk.{layer}.{block['.'.join(rest[:-1])]}.{rest[-1]}"
        else:
            name = names[name]
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
        kind = name.split(".")[-2]
        if kind in heads:  # llama.cpp's convert_hf_to_gguf permute
            n = heads[kind]
            rows = array.reshape(n, 2, array.shape[0] // n // 2, -1)
            array = rows.swapaxes(1, 2).reshape(array.shape)
        if array.ndim == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array), q8), raw_dtype=q8)
        else:
            w.add_tensor(name, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _hf_from_gguf(path):
    """transformers' own GGUF loading (dequantize + un-permute), without accelerate."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:  # every weight is loaded below: skip the random init (seconds at 135M)
        from transformers.initialization import no_init_weights
    except ImportError:
        from contextlib import nullcontext as no_init_weights

    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys
    model.tie_weights()
    return model.eval()


def test_tiny_llama_gguf_matches_transformers_gguf_loading(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    source = _hf_tiny("llama3", tie=False)  # (the GGUF gets no RoPE scaling: default rotary)
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(source, path)
    ours = load_model(path)
    assert ours.config.rope_scaling is None and not ours.config.tie_word_embeddings
    hf = _hf_from_gguf(path)
    check_paged_parity(ours, hf, _seqs(120), FP32_ATOL)
    # and the un-permuted, dequantized q_proj is the original one up to Q8_0 rounding
    q_size = 64
    ours_q = ours.model.layers[1].self_attn.qkv_proj.weight[:q_size]
    torch.testing.assert_close(
        ours_q, source.model.layers[1].self_attn.q_proj.weight, atol=0.02, rtol=0.02
    )


def test_gguf_index_is_parsed_once_then_read_from_the_cache(tmp_path, monkeypatch):
    import lmprog.runtime.models.loaders.gguf as gguf_loader

    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(_hf_tiny("llama3", tie=False), path)
    first = gguf_loader.read_gguf(path)
    assert list((tmp_path / "cache" / "gguf").glob("tiny-*.json"))

    def no_parsing(*args):
        raise AssertionError("the cached index should have been used")

    monkeypatch.setattr(gguf_loader, "GGUFReader", no_parsing)
    second = gguf_loader.read_gguf(path)
    assert second == first
    weights = dict(gguf_loader.gguf_weights(second))
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)
    path.touch()  # a changed file (mtime) is parsed again
    with pytest.raises(AssertionError, match="cached index"):
        gguf_loader.read_gguf(path)


# ------------------------------------------------------------------ the default model (e2e)


@pytest.fixture(scope="session")
def default_pair():
    from lmprog.core.models import resolve_model

    source = resolve_model()
    return load_model(source), _hf_from_gguf(source.path)


@pytest.mark.e2e
def test_default_model_matches_transformers(default_pair):
    from lmprog.core.models import load_tokenizer, resolve_model

    ours, hf = default_pair
    tok = load_tokenizer(resolve_model())
    texts = [
        "The capital of France is Paris, and the capital of Germany is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
        "Once upon a time, in a small village by the sea,",
        "Question: what is 17 * 3? Answer: 17 * 3 = 51. Question: what is 6 * 7?",
    ]
    seqs = [tok.encode(t) for t in texts]
    worst = check_paged_parity(ours, hf, seqs, DEFAULT_MODEL_ATOL)
    print(f"default model: max |logit diff| vs transformers = {worst:.2e}")
