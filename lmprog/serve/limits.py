"""ServerLimits: what one request may ask of the server (sizes, counts, token budgets).

Requests over a limit get a 4xx error; nothing is truncated silently.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLimits:
    """max_body_bytes: request body size (413 above it). max_json_depth: nesting of arrays and
    objects in a request body, and in the JSON text of a message's tool call arguments (400).
    max_n: choices per prompt (`n`). max_choices: prompts x n of one /v1/completions request.
    max_tokens: largest max_tokens / max_completion_tokens, and chat's default.
    max_stop: stop strings per request. max_logprobs: top_logprobs / completions' logprobs.
    max_concurrency: requests generating at once (one worker thread each); more wait their turn.
    """

    max_body_bytes: int = 2 << 20
    max_json_depth: int = 64
    max_n: int = 16
    max_choices: int = 64
    max_tokens: int = 4096
    max_stop: int = 16
    max_logprobs: int = 20
    max_concurrency: int = 256

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"server limit {f.name} must be an int >= 1, got {value!r}")
        if self.max_logprobs > 20:
            raise ValueError(
                f"max_logprobs must be <= 20 (the sampler's bound), got {self.max_logprobs}"
            )


LIMIT_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ServerLimits))
