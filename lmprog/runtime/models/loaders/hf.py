"""Weights from a Hugging Face folder of *.safetensors files (names used as they are)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open


def safetensors_weights(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"no *.safetensors files in {folder}; convert the checkpoint to "
            "safetensors (or load a GGUF)"
        )
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
