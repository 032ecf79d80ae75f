"""FP8 weights (lmprog.runtime.layers.fp8_linear): quantized at load and read from FP8
checkpoints (models/loaders/fp8.py), against the fp32 model."""

from __future__ import annotations

import copy

import pytest
import torch
from fp8_testing import TINY, dequantized, to_fp8_folder
from torch import nn
from tp_testing import write_tiny
from triton_testing import TRITON_SKIP

from lmprog.runtime.assemble import assemble_model, quantization_of
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.kernels.fp8_ref import FP8, dequantize_fp8, quantize_fp8_ref
from lmprog.runtime.layers.fp8_linear import Fp8Linear, quantize_fp8_
from lmprog.runtime.models import load_model

IDS = [5, 17, 3, 88, 42, 9, 61, 23, 70, 11, 2, 34]
# the Triton / _scaled_mm path: CUDA when there is one (bf16 out, fast accumulation), else
# the interpreter and torch's CPU _scaled_mm
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_TOL = 1e-2 if torch.cuda.is_available() else 4e-3


def prefill_logits(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """fp32 logits at every position of one prompt."""
    n = len(ids)
    kv = KVPool.for_model(model.config, n + 1, model.dtype, "cpu")
    table = torch.zeros(1, n + 1, dtype=torch.int32)
    table[0, :n] = torch.arange(1, n + 1)
    batch = ForwardBatch.build(input_ids=ids, out_cache_loc=range(1, n + 1),
                               req_pool_indices=[0], seq_lens=[n], extend_lens=[n],
                               req_to_token=table, logits_indices=range(n))  # fmt: skip
    with torch.inference_mode():
        return model(batch, kv)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_linear_is_the_dequantized_matmul_and_close_to_the_fp32_one():
    lin = nn.Linear(128, 96, bias=True)
    layer = Fp8Linear.from_linear(lin)
    assert layer.weight.dtype == FP8 and layer.weight_scale.shape == (96,)
    x = torch.randn(3, 5, 128)
    with torch.no_grad():
        y = layer(x)
        x_q, x_s = quantize_fp8_ref(x.reshape(15, 128))
        w = dequantize_fp8(layer.weight, layer.weight_scale)
        want = dequantize_fp8(x_q, x_s) @ w.t() + lin.bias
        assert torch.equal(y.reshape(15, 96), want)
        assert rel(y, lin(x)) < 0.06  # e4m3 keeps 3 mantissa bits: a few % per matmul
        tensor = Fp8Linear.from_linear(lin, per_tensor=True)
        assert tensor.weight_scale.unique().numel() == 1
        assert rel(tensor(x), lin(x)) < 0.08


@pytest.mark.skipif(TRITON_SKIP is not None, reason=TRITON_SKIP or "")
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("rows,fused", [(7, True), (7, False), (40, True)])
def test_kernel_path_matches_the_reference_path(static, rows, fused):
    """The CUDA path (up to 16 rows the fused small-M kernel, else Triton quantize_fp8 +
    torch._scaled_mm; here the interpreter and torch's CPU _scaled_mm) computes what the
    PyTorch path does, to its bf16 output's rounding."""
    layer = Fp8Linear.from_linear(nn.Linear(256, 64, bias=False)).to(KERNEL_DEVICE)
    if static:
        layer.input_scale = nn.Parameter(torch.tensor([0.01], device=KERNEL_DEVICE), False)
    layer.small_m_fused = fused
    x = torch.randn(rows, 256, device=KERNEL_DEVICE)
    with torch.no_grad():
        ref = layer(x)
        layer.use_kernels = True
        got = layer(x)
    assert got.dtype == x.dtype
    assert rel(got, ref) < KERNEL_TOL


@pytest.mark.skipif(TRITON_SKIP is not None, reason=TRITON_SKIP or "")
def test_block_kernel_path_matches_the_reference_path(tmp_path):
    tiny = write_tiny(tmp_path / "tiny", tied=False)
    to_fp8_folder(tiny, tmp_path / "block", "block")
    layer = load_model(tmp_path / "block").model.layers[0].mlp.down_proj.to(KERNEL_DEVICE)
    assert layer.group == 32 and layer.weight_scale.shape == (64, 3)
    x = torch.randn(5, 96, device=KERNEL_DEVICE)
    with torch.no_grad():
        ref = layer(x)
        layer.use_kernels = True
        got = layer(x)
    assert rel(got, ref) < KERNEL_TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times kernels in CUDA graphs")
def test_small_m_path_is_chosen_per_layer_shape_by_timing():
    from lmprog.runtime.layers.small_m import choose_small_m_paths_

    net = assemble_model(TINY, device="cuda", load_format="dummy", quantization="fp8")
    times = {(r.k, r.n): r for r in choose_small_m_paths_(net) if r.kind == "fp8"}
    assert set(times) == {(128, 256), (128, 128), (128, 512), (256, 128)}
    for layer in (m for m in net.modules() if isinstance(m, Fp8Linear)):
        timing = times[(layer.in_features, layer.out_features)]
        assert {"fused", "scaled_mm"} < set(timing.us) and min(timing.us.values()) > 0
        assert layer.small_m_fused == (timing.chosen == "fused")
        weight_only = timing.chosen not in ("fused", "scaled_mm")
        assert (layer.small_m_config is not None) == weight_only
        assert not weight_only or layer.small_m_config.label == timing.chosen


@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_at_load_replaces_every_linear_but_the_output_projection(seed):
    """Random weights as benchmarks draw them (std 0.02): the logits' relative error was
    0.046-0.050 over four seeds; the tolerance is 0.08."""
    fp32 = load_model(TINY, load_format="dummy", seed=seed)
    net = assemble_model(TINY, device="cpu", load_format="dummy", seed=seed, quantization="fp8")
    assert quantization_of(net) == "fp8" and quantization_of(fp32) is None
    fp8_layers = [m for m in net.modules() if isinstance(m, Fp8Linear)]
    assert len(fp8_layers) == 4 * net.config.num_layers  # qkv, o, gate_up, down
    assert type(net.lm_head) is nn.Linear
    want, got = prefill_logits(fp32, IDS), prefill_logits(net, IDS)
    assert 0.01 < rel(got, want) < 0.08


def test_quantize_refuses_a_model_without_quantizable_layers():
    with pytest.raises(ValueError, match="no linear layer"):
        quantize_fp8_(nn.Sequential(nn.Linear(20, 30)))  # K, N not multiples of 16
    model = nn.Sequential(nn.Linear(32, 20), nn.Linear(20, 32), nn.Linear(32, 32))
    assert quantize_fp8_(model) == 1 and type(model[0]) is nn.Linear


@pytest.mark.parametrize("mode", ["tensor", "channel", "block"])
def test_fp8_checkpoints_load_their_values_into_the_fused_layers(tmp_path, mode):
    """Every FP8 layer holds exactly the checkpoint's q * scale, q/k/v and gate/up in order;
    the model's logits are those of the dequantized checkpoint up to activation rounding."""
    tiny = write_tiny(tmp_path / "tiny", model_type="qwen2", tied=False)  # q/k/v biases
    tensors = to_fp8_folder(tiny, tmp_path / mode, mode, kv_scales=mode == "tensor")
    net = load_model(tmp_path / mode)
    assert quantization_of(net) == "fp8"
    for i, layer in enumerate(net.model.layers):
        p = f"model.layers.{i}."
        for module, parts in (
            (
                layer.self_attn.qkv_proj,
                ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            ),
            (layer.mlp.gate_up_proj, ("mlp.gate_proj", "mlp.up_proj")),
            (layer.mlp.down_proj, ("mlp.down_proj",)),
        ):
            want = torch.cat([dequantized(tensors, p + part, mode) for part in parts])
            got = dequantize_fp8(module.weight, module.weight_scale, module.group)
            assert torch.equal(got, want), (i, parts)
        if mode == "tensor":  # static: the largest of the fused shards' input scales
            assert layer.self_attn.qkv_proj.input_scale.item() == pytest.approx(0.1 + 0.01 * i)
    if mode == "tensor":
        assert net.kv_cache_scales == ((0.5, 1.5), (0.25, 0.25))
    # the dequantized checkpoint as an fp32 model: only the activations' rounding differs
    # (measured 0.13-0.18 relative: this tiny model's std-0.3 weights amplify rounding)
    plain = load_model(tiny)
    with torch.no_grad():
        for name, module in net.named_modules():
            if isinstance(module, Fp8Linear):
                w = dequantize_fp8(module.weight, module.weight_scale, module.group)
                plain.get_submodule(name).weight.copy_(w)
    assert rel(prefill_logits(net, IDS), prefill_logits(plain, IDS)) < 0.25


def test_fp8_checkpoint_errors(tmp_path):
    import json

    tiny = write_tiny(tmp_path / "tiny", tied=False)
    folder = tmp_path / "fp8"
    to_fp8_folder(tiny, folder, "channel")
    config = json.loads((folder / "config.json").read_text())
    for bad, match in [
        ({"quant_method": "awq"}, "quant_method"),
        ({"quant_method": "fp8", "activation_scheme": "mixed"}, "activation_scheme"),
        ({"quant_method": "fp8", "weight_block_size": [128, 100]}, "weight_block_size"),
    ]:
        (folder / "config.json").write_text(json.dumps({**config, "quantization_config": bad}))
        with pytest.raises(ValueError, match=match):
            load_model(folder)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="int4"):
        assemble_model(folder, device="cpu", quantization="int4")
    with pytest.raises(ValueError, match="tensor parallelism"):
        assemble_model(folder, device="cpu", tp=object())
    with pytest.raises(ValueError, match="'fp8'"):
        assemble_model(tiny, device="cpu", quantization="fp4")


# ---------------------------------------------------------------- the bundled model


@pytest.fixture(scope="module")
def smollm2():
    fp32 = load_model()  # the bundled SmolLM2-135M, fp32 on the CPU
    fp8 = copy.deepcopy(fp32)
    quantize_fp8_(fp8)
    return fp32, fp8


def test_bundled_model_in_fp8_stays_close_to_fp32(smollm2):
    """Per-channel e4m3 weights and per-token activations on SmolLM2-135M, teacher-forced
    over a short text: measured 93% top-1 agreement, mean |logprob difference| of the next
    token 0.16 (max 1.2); bf16 alone gives 0.03 (max 0.13). Tolerances leave some room."""
    from lmprog.core.models import load_tokenizer, resolve_model

    fp32, fp8 = smollm2
    text = (
        "The capital of France is Paris. The capital of Germany is Berlin. Here is a JSON "
        'object describing a person: {"name": "Alice", "age": 31, "city": "London"}. '
        "Question: what is 12 + 7? Answer: 19."
    )
    ids = load_tokenizer(resolve_model(None)).encode(text)
    want, got = prefill_logits(fp32, ids), prefill_logits(fp8, ids)
    target = torch.tensor(ids[1:])[:, None]
    diff = want.log_softmax(-1)[:-1].gather(1, target) - got.log_softmax(-1)[:-1].gather(1, target)
    agree = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
    print(f"\nSmolLM2 fp8 vs fp32: top-1 agreement {agree:.1%}, |dlogp| mean "
          f"{diff.abs().mean():.3f} max {diff.abs().max():.3f}")  # fmt: skip
    assert agree >= 0.85
    assert diff.abs().mean() < 0.3 and diff.abs().max() < 2.0
