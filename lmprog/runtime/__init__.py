"""lmprog's in-process runtime: paged KV pool, radix prefix cache, hybrid batching engine.

    from lmprog.runtime import launch_engine, EngineRequest
    engine = launch_engine(model, tokenizer, eos_token_ids=(2,))
    result = engine.submit(EngineRequest((1, 2, 3), SamplingParams(max_tokens=8))).result()

Most users want the `lmprog.Runtime` backend instead. Names here are imported on first use,
so `import lmprog.runtime` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Engine": "engine.engine",
    "EngineConfig": "config",
    "EngineRequest": "engine.io",
    "EngineResult": "engine.io",
    "RequestHandle": "engine.io",
    "launch_engine": "engine.launch",
    "ModelRunner": "executor.model_runner",
    "AttentionSinkConfig": "config",
    "CacheConfig": "config",
    "SchedulerConfig": "config",
    "SpeculativeConfig": "speculative.config",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
