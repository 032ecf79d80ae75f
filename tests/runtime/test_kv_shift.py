"""Attention sinks on the device side: keys re-rotated by -delta equal keys rotated at the new
positions; and on a one-layer model (whose K/V depend on the token alone) the engine with
sinks samples exactly what a fresh prefill of its window would, with overlap scheduling and
speculative verification as without them."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from engine_testing import EOS, TINY, random_llama, tok  # noqa: F401 - tok is a fixture
from spec_testing import Oracle

from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.index import TokenIndex
from lmprog.runtime.config import AttentionSinkConfig, SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.executor.kv_shift import KeyShifter, check_attention_sinks
from lmprog.runtime.layers.rotary import RotaryEmbedding
from lmprog.runtime.models.config import ModelConfig, RopeScaling
from lmprog.runtime.speculative.draft import DraftModelProposer

torch.set_num_threads(1)

SCALINGS = {
    "none": None,
    "linear": RopeScaling("linear", factor=4.0),
    "llama3": RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=64
    ),
}


def _config(scaling, head_dim=32):
    return dataclasses.replace(TINY, head_dim=head_dim, rope_theta=500.0, rope_scaling=scaling)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_keys_shifted_by_minus_delta_equal_keys_at_the_new_positions(scaling, dtype):
    config = _config(SCALINGS[scaling])
    rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
    g = torch.Generator().manual_seed(1)
    n, layers, heads = 24, 3, 2
    raw = torch.randn(layers, n, heads, config.head_dim, generator=g)
    pos = torch.randint(40, 1000, (n,), generator=g)
    delta = torch.randint(1, 40, (n,), generator=g)
    kv = KVPool(64, layers, heads, config.head_dim, dtype, "cpu")
    src = torch.arange(1, n + 1)
    dst = torch.cat([src[:12], torch.arange(40, 52)])  # half in place, half copied out
    cos, sin = rope.cos_sin(pos, torch.float32)
    for layer in range(layers):
        kv.write(layer, src, rope.rotate(raw[layer], cos, sin).to(dtype), raw[layer].to(dtype))
    before = [kv.k[layer][src].clone() for layer in range(layers)]
    KeyShifter(config).shift(kv, src, dst, delta)
    cos2, sin2 = rope.cos_sin(pos - delta, torch.float32)
    # fp32 angles p * freq carry p * 6e-8 rad of rounding on either side (RoPE's own error)
    tol = dict(atol=5e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    for layer in range(layers):
        want = rope.rotate(raw[layer], cos2, sin2)
        torch.testing.assert_close(kv.k[layer][dst].float(), want, **tol)
        assert torch.equal(kv.v[layer][dst], raw[layer].to(dtype))
        assert torch.equal(kv.k[layer][src[12:]], before[layer][12:])  # copies left as they were
        if dtype == torch.float32:  # and not merely rotated by some other angle
            assert not torch.allclose(kv.k[layer][dst], before[layer], atol=1e-3)


def test_every_source_is_read_before_any_destination_is_written():
    config = _config(None)
    kv = KVPool(8, 1, 1, config.head_dim, torch.float32, "cpu")
    kv.write(
        0,
        torch.tensor([1, 2]),
        torch.randn(2, 1, config.head_dim),
        torch.tensor([[[1.0]], [[2.0]]]).expand(2, 1, config.head_dim),
    )
    k = kv.k[0][[1, 2]].clone()
    KeyShifter(config).shift(kv, torch.tensor([1, 2]), torch.tensor([2, 1]), torch.tensor([0, 0]))
    assert torch.allclose(kv.k[0][[2, 1]], k) and kv.v[0][1, 0, 0] == 2.0
    with pytest.raises(ValueError, match="1-D of one length"):
        KeyShifter(config).shift(kv, torch.tensor([1]), torch.tensor([1, 2]), torch.tensor([1]))


def test_models_and_set_ups_that_cannot_shift_are_refused():
    gemma = dataclasses.replace(TINY, sliding_window=8, sliding_window_pattern=2)

    class Net(torch.nn.Module):
        def __init__(self, config: ModelConfig) -> None:
            super().__init__()
            self.config = config

    with pytest.raises(ValueError, match="Gemma 3 is not supported"):
        check_attention_sinks(Net(gemma))
    with pytest.raises(ValueError, match="tensor parallelism"):
        check_attention_sinks(Net(TINY), tp=object())
    check_attention_sinks(Net(TINY))


SINKS = AttentionSinkConfig(4, 28, 8)
LIMIT = 32


def _windows(prompt, out, sinks=4, limit=LIMIT, shift=8):
    """The KV sequence each output token was sampled from, by the scheduler's rule: before
    feeding the token at full index i, a full window (i - evicted == limit) evicts `shift`."""
    full, evicted, seqs = list(prompt) + list(out), 0, []
    for t in range(len(out)):
        end = len(prompt) + t  # tokens known before output t
        if t and end - 1 - evicted == limit:
            evicted += shift
        seqs.append(full[:sinks] + full[sinks + evicted : end])
    return seqs, evicted


@pytest.fixture(scope="module")
def one_layer():
    return random_llama(dataclasses.replace(TINY, num_layers=1), std=0.3)


def _engine(net, tok, sinks=SINKS, **kw):
    return launch_engine(
        net,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=200,
        scheduler_config=SchedulerConfig(max_num_batched_tokens=64, max_running_requests=8),
        attention_sinks=sinks,
        **kw,
    )


def test_a_one_layer_model_samples_what_a_fresh_prefill_of_its_window_gives(one_layer, tok):
    prompts = [[1000 + 3 * i + j for j in range(20 + i)] for i in range(3)]
    params = SP(max_tokens=70, temperature=0.0, ignore_eos=True, return_logprob=True)
    results = {}
    for name, kw in {
        "plain": {},
        "overlap": {"engine_config": EngineConfig(overlap=True, check_integrity=True)},
        "verify": {
            "proposer": Oracle(TINY.vocab_size),
            "engine_config": EngineConfig(check_integrity=True),
        },
        "draft": {  # a draft model re-prefills its own copy of each window after a shift
            "proposer": DraftModelProposer(one_layer, vocab_size=TINY.vocab_size, max_requests=8),
            "engine_config": EngineConfig(check_integrity=True),
        },
    }.items():
        if name == "verify":
            kw["proposer"].learn(prompts, results["plain"])
        engine = _engine(one_layer, tok, **kw)
        handles = [engine.submit(EngineRequest(tuple(p), params)) for p in prompts]
        results[name] = [h.result(timeout=300) for h in handles]
        stats = engine.stats()
        engine.shutdown()
        assert stats["kv_evicted_tokens"] > 0
        if name in ("verify", "draft"):
            assert stats["spec_accepted_tokens"] > 0
    outs = [r.token_ids for r in results["plain"]]
    assert [r.token_ids for r in results["overlap"]] == outs
    assert [r.token_ids for r in results["verify"]] == outs
    assert [r.token_ids for r in results["draft"]] == outs
    reference = _engine(one_layer, tok, sinks=None)  # the option off: plain prefills
    for prompt, r in zip(prompts, results["plain"]):
        windows, evicted = _windows(prompt, r.token_ids)
        assert evicted >= 40 and max(len(w) for w in windows) == LIMIT
        one = SP(max_tokens=1, temperature=0.0, ignore_eos=True, return_logprob=True)
        handles = [reference.submit(EngineRequest(tuple(w), one)) for w in windows]
        fresh = [h.result(timeout=300) for h in handles]
        assert [f.token_ids[0] for f in fresh] == list(r.token_ids)
        got = torch.tensor([lp.logprob for lp in r.logprobs])
        want = torch.tensor([f.logprobs[0].logprob for f in fresh])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    reference.shutdown()


def test_a_constraint_and_its_jump_forward_run_through_the_window(one_layer, tok):
    """A regex whose forced text (jump-forward) is longer than the window: the forced tail
    is fed in chunks with evictions between them; the text matches the pattern in full."""
    pattern = r"(The quick brown fox jumps over the lazy dog\. ){6}Score: [0-9]{2}\."
    index = TokenIndex.get(pattern, tok)
    engine = _engine(one_layer, tok, engine_config=EngineConfig(check_integrity=True))
    try:
        r = engine.submit(
            EngineRequest((1, 2, 3), SP(max_tokens=200, temperature=0.0), index.new_guide())
        ).result(timeout=300)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert r.finish_reason == "stop" and re.fullmatch(pattern, r.text), r.text
    assert len(r.token_ids) > LIMIT and stats["kv_evicted_tokens"] > 0
    assert stats["jump_forward_tokens"] > LIMIT  # forced tokens fed past the window
