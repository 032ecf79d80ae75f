"""Kernel tests run on a CUDA GPU when there is one (bf16/fp16/fp32, larger shapes) and
otherwise on the CPU through Triton's interpreter (fp32/fp16, small shapes).

TRITON_INTERPRET must be set before the kernels are decorated, i.e. before the first import
of lmprog.runtime.kernels' Triton modules: tests/conftest.py sets it before pytest imports
any test module. Shared constants and helpers live in kernel_helpers.py.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)
