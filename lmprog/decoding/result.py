"""EngineResult: what a DecodeState hands back to the runtime's callers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmprog.core.protocol import GenerateResult, TokenLogprob


@dataclass(frozen=True)
class EngineResult(GenerateResult):
    """A GenerateResult plus the prompt logprobs asked for with `prompt_logprob_start`
    (one entry per prompt token after it, in order)."""

    prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    def meta_info(self) -> dict[str, Any]:
        meta = super().meta_info()
        if self.prompt_logprobs is not None:
            meta["input_token_logprobs"] = list(self.prompt_logprobs)
        return meta
