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
from .limits import ServerLimits
from .metrics import ServerMetrics
from .unknown import UnknownFields

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

    def check_model(self, name: str) -> None:
        """Only the model the server was started with is served: a request's `model` is a
        name to check, never something to load."""
        if name != self.model_name:
            raise APIError(
                404,
                f"the model {name[:200]!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on a worker thread (tokenizing, compiling constraints, scoring)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
