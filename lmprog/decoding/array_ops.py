"""Which array operations an array or a device uses: numpy on the host, torch on a device.

ops_on(None)          numpy arrays on the host (the llama.cpp backend never imports torch)
ops_on(device)        torch tensors on that device (the runtime)
ops_for(x)            the ops of an existing array or tensor
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import NUMPY, ArrayOps


def ops_on(device: Any) -> ArrayOps:
    """The ops of arrays on `device`: None for numpy on the host, else a torch device (or
    its name; imports torch)."""
    if device is None:
        return NUMPY
    from .arrays_torch import torch_ops

    return torch_ops(device)


def ops_for(x: Any) -> ArrayOps:
    """The ops of `x`, a numpy array or a torch tensor."""
    if isinstance(x, np.ndarray):
        return NUMPY
    from .arrays_torch import torch_ops

    return torch_ops(x.device)


def device_of(x: Any) -> Any:
    """None for a numpy array, else the tensor's torch device."""
    return None if isinstance(x, np.ndarray) else x.device
