"""ServeContext: what every handler needs, built once per app (frozen)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lmprog.core.chat import ChatTemplate
from lmprog.core.protocol import Backend
from lmprog.core.reasoning import ReasoningFormat

from .errors import APIError
from .jsonbody import UnknownFields
from .limits import ServerLimits
from .metrics import ServerMetrics

T = TypeVar("T")


@dataclass(frozen=True)
class ServeContext:
    """backend: serves every request; model_name: the one name requests may ask for;
    executor: the worker threads that run blocking backend calls; reasoning: how the model's
    output splits into thinking and answer (--reasoning-parser, or the chat template's)."""

    backend: Backend
    model_name: str
    limits: ServerLimits
    executor: Executor
    metrics: ServerMetrics
    template: ChatTemplate
    created: int
    reasoning: ReasoningFormat | None = None  # the model's reasoning format (None: none)
    unknown_fields: UnknownFields = field(default_factory=UnknownFields)

    def check_model(self, name: str) -> str | None:
        """Only the model the server was started with and its loaded LoRA adapters are
        served: a request's `model` is a name to check, never something to load. Returns the
        adapter's name when `name` is one (the request runs under it), else None."""
        if name == self.model_name:
            return None
        if name in self.adapter_names():
            return name
        adapters = self.adapter_names()
        also = f" and the LoRA adapters {sorted(adapters)[:20]}" if adapters else ""
        raise APIError(
            404,
            f"the model {name[:200]!r} does not exist; this server serves "
            f"{self.model_name!r}{also}",
            param="model",
            code="model_not_found",
        )

    def adapters(self) -> list[dict[str, Any]]:
        """The backend's loaded LoRA adapters (name, path, ...); [] when it has none."""
        lister = getattr(self.backend, "lora_adapters", None)
        return [] if lister is None else list(lister())

    def adapter_names(self) -> set[str]:
        return {a["name"] for a in self.adapters()}

    def adapter(self, name: Any, param: str) -> str:
        """`name` when it is a loaded adapter's (SGLang's lora_path), else a 404 naming
        `param`."""
        if not isinstance(name, str) or name not in self.adapter_names():
            loaded = sorted(self.adapter_names())[:20]
            raise APIError(
                404,
                f"no LoRA adapter named {str(name)[:200]!r} is loaded (loaded: {loaded})",
                param=param,
                code="lora_not_found",
            )
        return name

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on a worker thread (tokenizing, compiling constraints, scoring)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
