"""The dequantized-weights cache of a GGUF (loaders/weight_cache.py): keyed by the file's
identity and checked before use. A warm load reads the entry instead of dequantizing and
yields the same tensors; a flipped byte, a truncated file, or a GGUF changed since (its
mtime) is detected and the entry rebuilt from the GGUF, never loaded."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from lmprog.runtime.models.loaders import load_model, weight_cache
from lmprog.runtime.models.loaders.gguf import gguf_weights, read_gguf

gguf = pytest.importorskip("gguf")


def write_gguf(path, seed=0):
    """A 1-layer llama-arch GGUF: 2-D weights Q8_0, norms F32 (random values)."""
    hidden, inter, heads, kv, vocab = 64, 96, 4, 2, 64
    d = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    shapes = {
        "token_embd.weight": (vocab, hidden),
        "output_norm.weight": (hidden,),
        "output.weight": (vocab, hidden),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (heads * d, hidden),
        "blk.0.attn_k.weight": (kv * d, hidden),
        "blk.0.attn_v.weight": (kv * d, hidden),
        "blk.0.attn_output.weight": (hidden, heads * d),
        "blk.0.ffn_gate.weight": (inter, hidden),
        "blk.0.ffn_up.weight": (inter, hidden),
        "blk.0.ffn_down.weight": (hidden, inter),
    }
    rng = np.random.default_rng(seed)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, shape in shapes.items():
        array = rng.normal(0, 0.3, shape).astype(np.float32)
        if len(shape) == 2:
            w.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(weight_cache.ENV_VAR, raising=False)
    return write_gguf(tmp_path / "tiny.gguf")


@pytest.fixture()
def dequantized(monkeypatch):
    """Counts the loads that dequantize the GGUF (instead of reading the cache)."""
    calls = []

    def counting(index):
        calls.append(index.path)
        yield from gguf_weights(index)

    monkeypatch.setattr(weight_cache, "gguf_weights", counting)
    return calls


def load(path):
    return dict(weight_cache.cached_gguf_weights(read_gguf(path)))


def entries(root):
    return sorted(p.name for p in (root / "weights").iterdir())


def assert_same(got, want):
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_warm_load_reads_the_checked_cache_and_rebuilds_a_damaged_one(model, dequantized, caplog):
    want = dict(gguf_weights(read_gguf(model)))
    assert_same(load(model), want)  # cold: dequantized and written through
    assert len(dequantized) == 1
    root = model.parent / "cache"
    (entry,) = (root / "weights").iterdir()
    data = entry / weight_cache.DATA
    assert (entry / weight_cache.DESCRIPTION).is_file()
    assert_same(load(model), want)  # warm: from the entry, nothing dequantized
    assert len(dequantized) == 1

    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40  # one flipped bit inside some tensor's values
    data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger=weight_cache.__name__):
        assert_same(load(model), want)
    assert "damaged" in caplog.text and "CRC-32" in caplog.text
    assert len(dequantized) == 2
    assert_same(load(model), want)  # rebuilt: sound again
    assert len(dequantized) == 2

    data.write_bytes(data.read_bytes()[:-100])  # truncated
    assert_same(load(model), want)
    assert len(dequantized) == 3

    stat = model.stat()  # the GGUF replaced or touched: a new key, the old entry removed
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert_same(load(model), want)
    assert len(dequantized) == 4
    assert entries(root) != [entry.name] and len(entries(root)) == 1


def test_load_model_serves_the_same_weights_from_the_cache(model, dequantized):
    first = load_model(str(model), dtype="float32")
    second = load_model(str(model), dtype="float32")
    assert len(dequantized) == 1
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_size_bound_turns_the_cache_off(model, dequantized, monkeypatch):
    monkeypatch.setenv(weight_cache.ENV_VAR, "0")
    load(model)
    load(model)
    assert len(dequantized) == 2
    assert not (model.parent / "cache" / "weights").exists()


def test_bf16_is_cached_in_bf16_beside_fp32_and_loads_the_same_values(
    model, dequantized, monkeypatch
):
    """A model computing in bf16 gets a bf16 entry (half the bytes), with the values it had
    from fp32 weights rounded on load; an fp32 entry of the same GGUF stays."""
    fp32 = load_model(str(model), dtype="float32")
    first = load_model(str(model), dtype="bfloat16")  # written through
    second = load_model(str(model), dtype="bfloat16")  # read back
    assert len(dequantized) == 2
    root = model.parent / "cache" / "weights"
    (plain,), (bf16,) = (
        [p for p in root.iterdir() if p.name.endswith(s) == want]
        for s, want in (("-bf16", False), ("-bf16", True))
    )
    size = (bf16 / weight_cache.DATA).stat().st_size
    assert size < 0.55 * (plain / weight_cache.DATA).stat().st_size
    monkeypatch.setenv(weight_cache.ENV_VAR, "0")
    uncached = load_model(str(model), dtype="bfloat16")
    for name, want in uncached.state_dict().items():
        assert want.dtype == torch.bfloat16 or not want.is_floating_point()
        assert torch.equal(first.state_dict()[name], want), name
        assert torch.equal(second.state_dict()[name], want), name
        assert torch.equal(fp32.state_dict()[name].to(want.dtype), want), name
