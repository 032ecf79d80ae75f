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
    max_tokens: largest max_tokens / max_completion_tokens (and max_output_tokens).
    default_max_tokens: max_tokens of a chat completion or Responses request that sets none
    (None: the max_tokens limit); /v1/completions keeps OpenAI's 16, /generate SGLang's 128.
    max_stop: stop strings per request; max_stop_chars: characters of one stop string.
    max_logprobs: top_logprobs / completions' logprobs. max_tools: entries of a chat request's
    `tools`. (A prompt's length is bounded by the model's context: `context_length_exceeded`.)
    max_concurrency: requests generating at once (one worker thread each); more wait their turn.
    constraint_timeout_s: seconds a request's regex / JSON schema / tools may take to compile
    into its constraint and token index (400 `constraint_timeout` after it; the compile runs
    on a worker thread, which is abandoned).
    allow_special_tokens: an option, not a limit: True reads special-token strings in chat
    message contents and tools (`<|im_start|>`, ...) as control tokens; by default they are
    text and only the chat template's own markers are control tokens.
    strict_requests: an option too: True answers a request with a field this server does not
    know (a typo, another server's extension, `messages[0].id`) with a 400
    `unknown_parameter`, as OpenAI does; by default such fields are dropped and logged once
    per name, as vLLM does. Known fields are type-checked strictly either way.
    """

    max_body_bytes: int = 2 << 20
    max_json_depth: int = 64
    max_n: int = 16
    max_choices: int = 64
    max_tokens: int = 4096
    default_max_tokens: int | None = None
    max_stop: int = 16
    max_stop_chars: int = 1024
    max_logprobs: int = 20
    max_tools: int = 128
    max_concurrency: int = 256
    constraint_timeout_s: float = 30.0
    allow_special_tokens: bool = False
    strict_requests: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _OPTIONS:
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be a bool, got {value!r}")
            elif f.name == "constraint_timeout_s":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                    raise ValueError(f"constraint_timeout_s must be a number > 0, got {value!r}")
            elif f.name == "default_max_tokens" and value is None:
                pass
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"server limit {f.name} must be an int >= 1, got {value!r}")
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"default_max_tokens {self.default_max_tokens} is over the max_tokens limit "
                f"{self.max_tokens}"
            )
        if self.max_logprobs > 20:
            raise ValueError(
                f"max_logprobs must be <= 20 (the sampler's bound), got {self.max_logprobs}"
            )

    @property
    def output_tokens(self) -> int:
        """max_tokens of a chat or Responses request that sets none."""
        return self.max_tokens if self.default_max_tokens is None else self.default_max_tokens


_OPTIONS = frozenset({"allow_special_tokens", "strict_requests"})
LIMIT_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ServerLimits))
