"""DeepSeek-V2 in the runtime against transformers' DeepseekV2ForCausalLM.

Tiny random configs saved as safetensors folders: latent attention with YaRN RoPE (mscale !=
mscale_all_dim, so both the cos/sin factor and the softmax scale count), with and without
the q LoRA, a dense first layer and MoE layers after (shared experts; greedy and
group-limited routing). Transformers decompresses k and v from the latents; the runtime
attends in the latent space with absorbed projections (prefill, chunks over a cached prefix,
decodes, hybrid batches alike): logits within 1e-4 in fp32, greedy tokens equal. Then the
engine with radix reuse, the Triton backend and the graph runners' static paths (Triton's
interpreter on the CPU), the preset's size, and the refusal of tensor parallelism.
"""

from __future__ import annotations

import pytest
import torch
from engine_testing import EOS, engine_for, greedy, run_all, tok  # noqa: F401 - tok: fixture
from test_parity import (
    FP32_ATOL,
    PagedRunner,
    _seqs,
    check_paged_parity,
    hf_logits,
    randomize_hf,
)
from triton_testing import requires_triton

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import PRESETS, build_model, load_model
from lmprog.runtime.parallel import check_shardable

torch.set_num_threads(1)

YARN = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "mscale": 1.0,
        "mscale_all_dim": 0.5, "original_max_position_embeddings": 32}  # fmt: skip


def _hf_tiny(vocab=120, q_lora=None, grouped=False, layers=3, bias=False, std=0.3, rope=YARN):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    cfg = DeepseekV2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        n_shared_experts=1,
        first_k_dense_replace=1,
        topk_method="group_limited_greedy" if grouped else "greedy",
        n_group=4 if grouped else None,
        topk_group=2 if grouped else None,
        routed_scaling_factor=1.5 if grouped else 1.0,
        attention_bias=bias,
        max_position_embeddings=1024,
        rope_parameters=dict(rope),
        attn_implementation="eager",
    )
    return randomize_hf(DeepseekV2ForCausalLM(cfg), std)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """q_proj, greedy routing: (transformers model, our model loaded from its folder)."""
    folder = tmp_path_factory.mktemp("deepseek_v2")
    hf = _hf_tiny()
    hf.save_pretrained(folder)
    return hf, load_model(folder)


def test_tiny_deepseek_v2_matches_transformers(tiny):
    hf, ours = tiny
    c = ours.config
    assert (c.architecture, c.kv_lora_rank, c.qk_rope_head_dim, c.q_lora_rank) == (
        "deepseek_v2",
        32,
        8,
        None,
    )
    assert c.mlp_only_layers == (0,) and [c.is_moe_layer(i) for i in range(3)] == [0, 1, 1]
    assert c.rope_scaling.rope_type == "yarn" and c.rope_scaling.cos_sin_scale != 1.0
    assert check_paged_parity(ours, hf, _seqs(120), FP32_ATOL) > 0


@pytest.mark.parametrize("grouped,bias", [(True, False), (False, True)])
def test_q_lora_group_limited_routing_and_biases_match_transformers(grouped, bias, tmp_path):
    hf = _hf_tiny(q_lora=24, grouped=grouped, bias=bias)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert ours.config.q_lora_rank == 24 and ours.config.attention_bias == bias
    assert (ours.config.n_group, ours.config.topk_group) == ((4, 2) if grouped else (1, 1))
    check_paged_parity(ours, hf, _seqs(120), FP32_ATOL)


def test_rope_rows_are_reordered_at_load(tiny, tmp_path):
    """Loading the checkpoint's RoPE rows as they are (pairwise layout under rotate-half
    RoPE) must break parity: the reordering is what makes it hold."""
    hf, ours = tiny
    from lmprog.runtime.models import deepseek_v2

    keep = deepseek_v2._halves_layout
    try:
        deepseek_v2._halves_layout = lambda rows, rope: rows
        hf.save_pretrained(tmp_path)
        plain = load_model(tmp_path)
    finally:
        deepseek_v2._halves_layout = keep
    seq = _seqs(120)[1]
    (good,) = PagedRunner(ours).step([(0, seq)])
    (bad,) = PagedRunner(plain).step([(0, seq)])
    want = hf_logits(hf, seq)
    assert (good - want).abs().max() < FP32_ATOL < (bad - want).abs().max()


def test_greedy_generation_equals_transformers(tiny):
    hf, ours = tiny
    prompt = _seqs(120)[0]
    with torch.inference_mode():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)
    want = want[0, len(prompt) :].tolist()
    runner = PagedRunner(ours)
    (logits,) = runner.step([(0, prompt)])
    got = [int(logits[-1].argmax())]
    while len(got) < 10:
        (logits,) = runner.step([(0, [got[-1]])])
        got.append(int(logits[-1].argmax()))
    assert got == want


@pytest.fixture(scope="module")
def tok_sized(tmp_path_factory):
    """A tiny model with the default tokenizer's vocabulary (for the engine); small weights,
    so its outputs repeat (n-gram drafts)."""
    folder = tmp_path_factory.mktemp("deepseek_v2_49k")
    hf = _hf_tiny(vocab=49152, std=0.05)
    hf.save_pretrained(folder)
    return hf, load_model(folder)


def _hf_greedy(hf, prompts, new):
    with torch.inference_mode():
        return [
            hf.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new,
                        do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]  # fmt: skip


def test_engine_with_radix_reuse_gives_transformers_greedy_tokens(tok, tok_sized):
    """A second request sharing the first one's prompt head is served from the radix cache
    and still generates transformers' greedy tokens (as does a cache-less engine)."""
    hf, ours = tok_sized
    head = list(range(1000, 1030))
    first, second = head + [3001, 3002], head + [4001, 4002, 4003]
    want = _hf_greedy(hf, [first, second], 8)
    for radix in (True, False):
        eng = engine_for(ours, tok, radix=radix, slots=512)
        try:
            a = run_all(eng, [first], greedy(8))[0]
            b = run_all(eng, [second], greedy(8))[0]
        finally:
            eng.shutdown()
        assert [list(a.token_ids), list(b.token_ids)] == want
        assert b.cached_tokens == (len(head) if radix else 0)


def test_engine_chunked_retracted_and_speculative_generation_equals_transformers(tok, tok_sized):
    from lmprog.runtime.engine.launch import launch_engine
    from lmprog.runtime.speculative import SpeculativeConfig

    hf, ours = tok_sized
    prompts = [list(range(2000, 2019)), [5, 9, 11] * 5, list(range(3000, 3017))]
    want = _hf_greedy(hf, prompts, 12)
    spec = SpeculativeConfig(method="ngram", num_tokens=3, adaptive=False)
    tight = {"init_new_token_ratio": 0.02, "min_new_token_ratio": 0.02}  # admit, then retract
    for kwargs in (
        {"slots": 512, "budget": 8, "max_reqs": 4, "overlap": True},  # 8-token chunks
        {"slots": 60, "budget": 16, "max_reqs": 4, **tight},  # 60 slots for 3 x ~29 tokens
        {"speculative": spec},
    ):
        if "speculative" in kwargs:
            eng = launch_engine(ours, tok, eos_token_ids=EOS, max_total_tokens=512, **kwargs)
        else:
            eng = engine_for(ours, tok, **kwargs)
        try:
            got = [list(r.token_ids) for r in run_all(eng, prompts, greedy(12))]
            stats = eng.stats()
        finally:
            eng.shutdown()
        assert got == want, kwargs
        verified = stats.get("spec_verified_tokens", 0)
        assert (verified > 0) == ("speculative" in kwargs)  # drafts were verified
        assert (stats["num_retractions"] > 0) == (kwargs.get("slots") == 60)


@requires_triton
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the interpreter on CPU tensors; on a GPU tests/kernels/test_attention_latent.py runs",
)
def test_triton_backend_and_graph_static_paths_match_torch(tiny, tmp_path):
    """The whole model on the Triton backend (the interpreter) against the torch backend,
    and the decode and piecewise graph runners' padded static forwards against eager."""
    from lmprog.runtime.executor.cuda_graph import CudaGraphRunner
    from lmprog.runtime.executor.piecewise_graph import PiecewiseGraphRunner

    hf, ours = tiny
    hf.save_pretrained(tmp_path)
    tri = load_model(tmp_path, attention="triton")
    assert tri.attention.rope_dim == 8 and tri.attention.scale == ours.attention.scale
    seqs = _seqs(120)
    table = torch.arange(1, 4 * 64 + 1, dtype=torch.int32).view(4, 64)
    pools = [KVPool.for_model(ours.config, 4 * 64, torch.float32, "cpu") for _ in range(3)]

    def batch(rows, ids, lens):
        locs = torch.cat([table[r, s - len(i) : s] for r, i, s in zip(rows, ids, lens)])
        return ForwardBatch.build(
            input_ids=[t for i in ids for t in i], out_cache_loc=locs, req_pool_indices=rows,
            seq_lens=lens, extend_lens=[len(i) for i in ids], req_to_token=table,
        )  # fmt: skip

    prefill = batch([0, 1, 2], [seqs[0], seqs[1][:7], seqs[2]], [11, 7, 9])
    mixed = batch([1, 0, 2], [seqs[1][7:], [5], [6]], [19, 12, 10])
    decode = batch([0, 1, 2], [[7], [8], [9]], [13, 20, 11])
    with torch.inference_mode():
        pieces = PiecewiseGraphRunner(tri, pools[2], table, max_tokens=32, capture=False)
        graphs = CudaGraphRunner(tri, pools[2], table, batch_sizes=(2, 4), capture=False)
        for step in (prefill, mixed, decode):
            want = ours(step, pools[0])
            torch.testing.assert_close(tri(step, pools[1]), want, atol=FP32_ATOL, rtol=0)
            runner = graphs if step is decode else pieces
            got = runner.maybe_run(step, pools[2])
            assert got is not None
            torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=0)


def test_preset_has_the_published_size_and_latent_kv_bytes():
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    cfg = PRESETS["deepseek-v2-lite"]
    model = build_model(cfg, device="meta", dtype="bfloat16")
    ours = sum(p.numel() for p in model.parameters())
    hf = DeepseekV2Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
        num_attention_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6,
        moe_intermediate_size=1408, n_shared_experts=2, first_k_dense_replace=1,
    )  # fmt: skip
    with torch.device("meta"):
        theirs = sum(p.numel() for p in DeepseekV2ForCausalLM(hf).parameters())
    assert ours == theirs == 15_706_484_224  # "15.7B"
    dense = sum(p.numel() for p in build_model(PRESETS["llama-3.2-3b"], device="meta").parameters())
    assert dense == 3_212_749_824
    assert KVPool.bytes_per_token(cfg, torch.bfloat16) == 31_104  # 27 x (512 + 64) x 2


def test_dummy_weights_in_bf16_give_finite_seeded_logits():
    from lmprog.runtime.models import ModelConfig, RopeScaling

    lite = PRESETS["deepseek-v2-lite"]
    small = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_layers": 3,
             "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64}  # fmt: skip
    cfg = ModelConfig(**{**lite.__dict__, **small})
    assert cfg.kv_lora_rank == 512 and isinstance(cfg.rope_scaling, RopeScaling)
    logits = []
    for seed in (1, 1, 2):
        model = load_model(cfg, load_format="dummy", dtype="bfloat16", seed=seed)
        (got,) = PagedRunner(model).step([(0, list(range(3, 40)))])
        logits.append(got)
    assert torch.isfinite(logits[0]).all() and logits[0].std() > 0
    assert torch.equal(logits[0], logits[1]) and not torch.equal(logits[0], logits[2])


def test_tensor_parallelism_is_refused_with_a_reason():
    check_shardable(PRESETS["deepseek-v2-lite"], 1)
    with pytest.raises(ValueError, match="latent attention"):
        check_shardable(PRESETS["deepseek-v2-lite"], 2)


@requires_triton
def test_fp32_latent_attention_on_cuda_is_refused_when_the_model_is_built():
    """16 query heads a latent tile in fp32 made an illegal memory access on the H200: the
    model is refused when built (before any CUDA allocation), not at its first step."""
    with pytest.raises(ValueError, match="latent attention in float32 on CUDA"):
        build_model(PRESETS["deepseek-v2-lite"], device="cuda", dtype="float32", attention="triton")
