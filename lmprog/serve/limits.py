"""ServerLimits: what one request may ask of the server (sizes, counts, token budgets).

Requests over a limit get a 4xx error; nothing is truncated silently.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask (sizes, counts, token budgets), and two options; each field's
    meaning: docs/design/server.md#limits-and-fault-isolation."""

    max_body_bytes: int = 2 << 20  # request body size (413 above it)
    max_json_depth: int = 64  # nesting of a body's JSON and of a tool call's arguments (400)
    max_n: int = 16  # choices per prompt (`n`)
    max_choices: int = 64  # prompts x n of one /v1/completions request
    max_tokens: int = 4096  # largest max_tokens / max_completion_tokens / max_output_tokens
    default_max_tokens: int | None = None  # chat / Responses without one (None: max_tokens)
    max_stop: int = 16  # stop strings per request
    max_stop_chars: int = 1024  # characters of one stop string
    max_logprobs: int = 20  # top_logprobs / completions' logprobs
    max_tools: int = 128  # entries of a chat request's `tools`
    max_concurrency: int = 256  # requests generating at once; more wait their turn
    constraint_timeout_s: float = 30.0  # a constraint's compile (400 `constraint_timeout`)
    allow_special_tokens: bool = False  # option: special tokens in messages are control tokens
    strict_requests: bool = False  # option: unknown fields are a 400 `unknown_parameter`
    # images (a vision-language model's): per request, their count, encoded bytes and
    # pixels (all images together); where they may come from besides data URLs
    max_images: int = 16
    max_image_bytes: int = 16 << 20
    max_image_pixels: int = 40_000_000
    allow_image_urls: bool = False  # option: fetch http(s) image URLs (else a 400)
    image_fetch_timeout_s: float = 10.0  # a fetched image's whole download
    allowed_image_folders: tuple[str, ...] = ()  # local files readable as images (else a 400)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _OPTIONS:
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be a bool, got {value!r}")
            elif f.name in ("constraint_timeout_s", "image_fetch_timeout_s"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                    raise ValueError(f"{f.name} must be a number > 0, got {value!r}")
            elif f.name == "allowed_image_folders":
                object.__setattr__(self, f.name, _folders(value))
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


def _folders(value: object) -> tuple[str, ...]:
    """The allowed image folders as absolute real paths (symlinks resolved); ValueError for
    one that is not an existing folder."""
    if isinstance(value, (str, os.PathLike)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"allowed_image_folders must be a list of folders, got {value!r}")
    out = []
    for folder in value:
        if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(folder):
            raise ValueError(f"allowed_image_folders: {folder!r} is not an existing folder")
        out.append(os.path.realpath(folder))
    return tuple(out)


_OPTIONS = frozenset({"allow_special_tokens", "strict_requests", "allow_image_urls"})
LIMIT_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ServerLimits))
