"""Kernel tests run on a CUDA GPU when there is one (bf16/fp16/fp32, larger shapes) and
otherwise on the CPU through Triton's interpreter (fp32/fp16, small shapes).

TRITON_INTERPRET must be set before the kernels are decorated, i.e. before the first import
of lmprog.runtime.kernels' Triton modules: pytest imports this file before the test modules.
Shared constants and helpers live in kernel_helpers.py.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)
