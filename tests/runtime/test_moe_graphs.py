"""A Mixtral in the decode and piecewise CUDA graphs: the graph tests' checks against the
eager forward (test_cuda_graph, test_piecewise_graph) with every MLP a sparse MoE block through
the fused Triton kernel, whose routing and expert grouping are device ops of fixed shapes.

On the CPU the padded, segmented forward of the piecewise graphs runs uncaptured under
Triton's interpreter (the decode graphs' padded forward is the same model code; its check
costs another ~15 s there, so it runs on a GPU only); capture and replay of both (bf16 and
fp32) run on a GPU.
"""

from functools import partial

import pytest
from test_cuda_graph import check_against_eager as check_decode
from test_piecewise_graph import check_against_eager as check_piecewise
from triton_testing import (  # noqa: F401 - one_thread is a fixture
    ON_GPU,
    one_thread,
    requires_triton,
    run_captured,
    run_uncaptured,
)

CHECKS = {"decode": check_decode, "piecewise": check_piecewise}


@requires_triton
@pytest.mark.parametrize(
    "kind",
    [
        "piecewise",
        pytest.param("decode", marks=pytest.mark.skipif(not ON_GPU, reason="slow on a CPU")),
    ],
)
def test_moe_model_in_graphs_uncaptured(kind, one_thread):
    run_uncaptured(partial(CHECKS[kind], moe=True))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graph capture needs a GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kind", sorted(CHECKS))
def test_moe_model_in_graphs_captured(kind, dtype, one_thread):
    run_captured(partial(CHECKS[kind], moe=True), dtype)
