"""Shared by the tensor-parallel tests: a tiny HF folder (with or without the default model's
tokenizer), the comparison with TP=1's results, and the worker processes this test process
left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


def assert_same(results, reference):
    """Greedy tokens equal, logprobs within fp32 tolerance (the ranks sum in another order)."""
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    for got, want in zip(results, reference):
        a = torch.tensor([t.logprob for t in got.logprobs])
        b = torch.tensor([t.logprob for t in want.logprobs])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def leftover_workers() -> list[int]:
    """Pids of live (not zombie) tensor-parallel workers started by this process."""
    me, found = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z" and b"lmprog.runtime.parallel.worker" in cmdline:
            found.append(int(proc.name))
    return found


def write_tiny(folder, *, model_type="llama", heads=4, kv_heads=2, vocab=101, tied=True):
    """An HF folder (config.json + safetensors) of a tiny model with random weights large
    enough (std 0.3) that greedy outputs depend on the whole context."""
    hidden, inter, layers, d = 64, 96, 2, 16
    hf = {
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": d,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied,
    }
    g = torch.Generator().manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    w = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    if not tied:
        w["lm_head.weight"] = rand(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": 1 + rand(hidden) * 0.1,
            p + "post_attention_layernorm.weight": 1 + rand(hidden) * 0.1,
            p + "self_attn.q_proj.weight": rand(heads * d, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * d, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * d, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * d),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
        if model_type == "qwen2":  # q/k/v biases
            w[p + "self_attn.q_proj.bias"] = rand(heads * d)
            w[p + "self_attn.k_proj.bias"] = rand(kv_heads * d)
            w[p + "self_attn.v_proj.bias"] = rand(kv_heads * d)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf))
    save_file(w, str(folder / "model.safetensors"))
    return folder


def write_tiny_with_tokenizer(folder):
    """write_tiny over the default model's vocabulary, with its tokenizer saved beside it (an
    HF folder lp.Runtime loads whole); skips the test where the default model is missing."""
    from hf_tiny import default_hf_tokenizer

    tok = default_hf_tokenizer()
    folder = write_tiny(folder, vocab=len(tok))
    tok.save_pretrained(folder)
    return folder
