"""Sampling parameters: the one dataclass every layer passes around.

The DSL's per-call and per-run defaults are merged into it in one place
(`SamplingParams.merged`); backends and the runtime only ever see the result.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from lmprog.core.text import check_text

_UNSET: Any = None  # a field left as None in an override inherits the base value


@dataclass(frozen=True)
class SamplingParams:
    """How to generate one continuation.

    `top_k=-1`, `top_p=1.0` and `min_p=0.0` disable those filters; `temperature=0` is greedy.
    `stop` strings are removed from the returned text; `stop_token_ids` end generation too;
    so does the output matching one of the `stop_regex` patterns (Python `re.search`, as
    SGLang's `stop_regex`), the match kept in the text. `n` is how many continuations a DSL
    gen draws (SGLang's `n`: its variable a list of them); a backend request is always one
    continuation.
    `repetition_penalty` (CTRL's, as vLLM and SGLang apply it; 1.0 disables it): the logit of
    every token already in the prompt or the output is divided by it when positive and
    multiplied by it when negative, so a penalty > 1 makes repeats less likely, < 1 more.
    `skip_special_tokens=False` keeps special tokens' text in the output (SGLang's and vLLM's
    parameter; a reasoning model whose markers are special tokens, as gpt-oss's channels).
    `lora_path` (SGLang's name) is the LoRA adapter to generate under: the name of an
    adapter the backend has loaded (`lp.Runtime(lora_paths={name: path})`, `lmprog serve
    --lora-paths`); None is the base model. A run's default like any field here
    (`f.run(..., lora_path="sql")`), and its selects score under it too.
    """

    max_tokens: int = 128
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_regex: tuple[str, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    n: int = 1
    skip_special_tokens: bool = True
    lora_path: str | None = None

    def __post_init__(self) -> None:
        # Normalise the two list-like fields so callers may pass a str/list.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", _as_tuple("stop", self.stop, "strings"))
        if isinstance(self.stop_regex, str):
            object.__setattr__(self, "stop_regex", (self.stop_regex,))
        elif not isinstance(self.stop_regex, tuple):
            object.__setattr__(
                self, "stop_regex", _as_tuple("stop_regex", self.stop_regex, "patterns")
            )
        if isinstance(self.stop_token_ids, int):
            object.__setattr__(self, "stop_token_ids", (self.stop_token_ids,))
        elif not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(
                self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids, "ints")
            )
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalised(self) -> bool:
        """Whether a penalty reads the tokens seen so far (frequency, presence, repetition)."""
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def validate(self) -> None:
        """Raise TypeError/ValueError naming the first invalid field."""
        _check_int("max_tokens", self.max_tokens, lo=0)
        _check_int("min_tokens", self.min_tokens, lo=0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens} is larger than max_tokens={self.max_tokens}; "
                "lower min_tokens or raise max_tokens"
            )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise TypeError(f"stop must be non-empty strings, got {s!r}")
            check_text(s, "a stop string")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, lo=0)
        for pattern in self.stop_regex:
            _check_stop_regex(pattern)
        _check_float("temperature", self.temperature, lo=0.0)
        _check_float("top_p", self.top_p, lo=0.0, hi=1.0)
        if self.top_p == 0.0:
            raise ValueError("top_p must be in (0, 1]; use temperature=0 for greedy decoding")
        _check_int("top_k", self.top_k, lo=-1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (disabled) or >= 1, got 0")
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0)
        _check_float("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        _check_float("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _check_float("repetition_penalty", self.repetition_penalty, lo=0.0)
        if self.repetition_penalty == 0.0:
            raise ValueError("repetition_penalty must be > 0 (1.0 disables it), got 0")
        if not isinstance(self.skip_special_tokens, bool):
            raise TypeError(f"skip_special_tokens must be a bool, got {self.skip_special_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0)
        if not isinstance(self.return_logprob, bool):
            raise TypeError(f"return_logprob must be a bool, got {self.return_logprob!r}")
        _check_int("top_logprobs_num", self.top_logprobs_num, lo=0, hi=20)
        _check_int("n", self.n, lo=1)
        if self.lora_path is not None and (
            not isinstance(self.lora_path, str) or not self.lora_path.strip()
        ):
            raise TypeError(
                f"lora_path must be a LoRA adapter's name (a non-empty str) or None, got "
                f"{self.lora_path!r}"
            )

    def merged(self, overrides: dict[str, Any]) -> SamplingParams:
        """A copy with every non-None value of `overrides` applied (unknown keys raise).

        SGLang's names are accepted too (see `canonical_sampling_names`).
        """
        overrides = canonical_sampling_names(overrides)
        unknown = set(overrides) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(
                f"unknown sampling parameter(s) {sorted(unknown)}; "
                f"valid ones are {sorted(SAMPLING_FIELDS)} "
                f"(and SGLang's {sorted(SGLANG_SAMPLING_ALIASES)})"
            )
        changes = {k: v for k, v in overrides.items() if v is not _UNSET}
        return dataclasses.replace(self, **changes) if changes else self


SAMPLING_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(SamplingParams))

# SGLang's spelling of a sampling field (in run()/run_batch() defaults and sampling_params).
SGLANG_SAMPLING_ALIASES: dict[str, str] = {"max_new_tokens": "max_tokens"}
# SGLang sampling keywords with no lmprog field: `return_text_in_logprobs` (lmprog's
# logprobs always carry the token text) and `logprob_start_len` (prompt logprobs, which
# gens do not return: only None or -1, SGLang's "none", is accepted).
_SGLANG_NO_OP = frozenset({"return_text_in_logprobs", "logprob_start_len"})

# Every keyword that names a sampling default: lmprog's fields and SGLang's names.
SAMPLING_NAMES: frozenset[str] = SAMPLING_FIELDS | SGLANG_SAMPLING_ALIASES.keys() | _SGLANG_NO_OP


def canonical_sampling_names(params: dict[str, Any], keep: Collection[str] = ()) -> dict[str, Any]:
    """`params` with SGLang's names mapped to lmprog's (`max_new_tokens` -> `max_tokens`).

    Keys in `keep` (a program's own parameters) pass unchanged. Raises ValueError when
    both spellings of one field are given with different values, and for a
    `logprob_start_len` other than None/-1.
    """
    if not any(k in SGLANG_SAMPLING_ALIASES or k in _SGLANG_NO_OP for k in params):
        return params
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in keep:
            out[key] = value
            continue
        if key == "logprob_start_len":
            if value is not None and value != -1:
                raise ValueError(
                    f"logprob_start_len={value!r}: lmprog's gens return no prompt logprobs "
                    "(only output_token_logprobs); leave it unset"
                )
            continue
        if key == "return_text_in_logprobs":
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"return_text_in_logprobs must be a bool, got {value!r}")
            continue  # lmprog's logprobs always hold the token text
        name = SGLANG_SAMPLING_ALIASES.get(key, key)
        if value is None and name in out:
            continue
        if out.get(name) is not None and value is not None and out[name] != value:
            spellings = [name, *(k for k, v in SGLANG_SAMPLING_ALIASES.items() if v == name)]
            raise ValueError(
                f"{' and '.join(spellings)} (SGLang's name for it) are both given, with "
                f"different values {out[name]!r} and {value!r}; give one of them"
            )
        if value is not None or name not in out:
            out[name] = value
    return out


def _as_tuple(name: str, value: Any, of: str) -> tuple[Any, ...]:
    """A list-like value as a tuple (TypeError naming the field for anything else)."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Collection):
        raise TypeError(
            f"{name} must be a list of {of} (or one), got {type(value).__name__} {value!r}"
        )
    return tuple(value)


def _check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")


def _check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _check_stop_regex(pattern: Any) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise TypeError(f"stop_regex must be non-empty patterns, got {pattern!r}")
    check_text(pattern, "a stop_regex")
    try:
        _compiled(pattern)
    except re.error as e:
        raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {e}") from None


def stop_regex_match(patterns: tuple[str, ...], text: str) -> str | None:
    """The first of `patterns` that `re.search` finds in `text` (SGLang's stop_regex), or None."""
    for pattern in patterns:
        if _compiled(pattern).search(text) is not None:
            return pattern
    return None
