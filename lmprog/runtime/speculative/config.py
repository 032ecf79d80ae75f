"""SpeculativeConfig: how an engine speculates (frozen, validated; no torch).

    lp.Runtime(speculative=SpeculativeConfig(method="ngram", num_tokens=8))
    lp.Runtime(speculative={"method": "draft", "draft_model": "llama-3.2-1b",
                            "draft_load_format": "dummy"})

Device-dependent defaults (None fields) are resolved by `resolved_for(device_type)`, which
returns the numbers to use; the config itself is never written back.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, TypedDict, cast

SpeculativeMethod = Literal["ngram", "draft", "eagle", "medusa"]
METHODS: tuple[str, ...] = ("ngram", "draft", "eagle", "medusa")
LOAD_FORMATS: tuple[str, ...] = ("auto", "dummy")


# Device-dependent defaults, from measurements (docs/benchmarks.md, speculative decoding).
# draft_cost: one more verified token, as a fraction of a batch-1 decode step (on a CPU
# each fed token adds compute; a GPU reads the weights once for all); the Speculator adds
# the measured cost of proposing it.
# max_step_tokens: fed tokens of decoding requests beyond which a step is compute-bound.
class _Defaults(TypedDict):
    draft_cost: float
    max_step_tokens: int


_DEFAULTS: dict[str, _Defaults] = {
    "cpu": {"draft_cost": 0.15, "max_step_tokens": 32},
    "cuda": {"draft_cost": 0.02, "max_step_tokens": 128},
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """method: "ngram" (prompt lookup), "draft" (`draft_model`, same tokenizer), "eagle" (an
    EAGLE-3 or EAGLE-1/2 head, detected from `draft_model`, its folder; None the head
    shipped for the bundled model) or
    "medusa" (`draft_model` the Medusa heads' folder); num_tokens: most drafts verified per
    request per step; ngram_min / ngram_max; ngram_branches: > 1 drafts token trees of that
    many n-gram continuations (1: a chain); draft_model and draft_load_format ("auto" |
    "dummy": random weights; for a head, one shaped for the target); tree_width: heads
    propose chains (1) or trees of the top-w tokens per depth (w > 1); tree_depth: an EAGLE
    head's dynamic tree (EAGLE-2): that many depths, each expanding the w drafts of best
    cumulative probability, the best num_tokens of all verified (None: the static tree of
    tree_width); adaptive: per-request
    draft lengths (False: always
    num_tokens); draft_cost: one draft's cost as a fraction of a step (None: measured);
    max_step_tokens: fed decode tokens per step above which no drafts are added (None: 32 on a
    CPU, 128 on a GPU). Details: docs/design/speculative.md.
    """

    method: SpeculativeMethod = "ngram"
    num_tokens: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    ngram_branches: int = 1
    draft_model: str | None = None
    draft_load_format: str = "auto"
    tree_width: int = 1
    tree_depth: int | None = None
    adaptive: bool = True
    draft_cost: float | None = None
    max_step_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        _check_int("num_tokens", self.num_tokens, 1)
        _check_int("ngram_min", self.ngram_min, 1)
        _check_int("ngram_max", self.ngram_max, 1)
        _check_int("ngram_branches", self.ngram_branches, 1)
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})"
            )
        if self.method == "draft" and not self.draft_model:
            raise ValueError('method="draft" needs draft_model (a model name, path or preset)')
        if self.method == "medusa" and not self.draft_model and self.draft_load_format != "dummy":
            raise ValueError('method="medusa" needs draft_model (the Medusa heads\' folder)')
        _check_int("tree_width", self.tree_width, 1)
        if self.tree_width > 1 and self.method not in ("eagle", "medusa"):
            raise ValueError("tree_width > 1 needs a draft head (method 'eagle' or 'medusa')")
        if self.tree_depth is not None:
            _check_int("tree_depth", self.tree_depth, 1)
            if self.method != "eagle":
                raise ValueError("tree_depth (a dynamic tree) needs an EAGLE head (method 'eagle')")
        if self.draft_model is not None and not isinstance(self.draft_model, str):
            raise TypeError(f"draft_model must be a str, got {type(self.draft_model).__name__}")
        if self.draft_load_format not in LOAD_FORMATS:
            raise ValueError(
                f"draft_load_format must be one of {LOAD_FORMATS}, got {self.draft_load_format!r}"
            )
        if not isinstance(self.adaptive, bool):
            raise TypeError(f"adaptive must be a bool, got {self.adaptive!r}")
        if self.draft_cost is not None and (
            isinstance(self.draft_cost, bool)
            or not isinstance(self.draft_cost, (int, float))
            or not 0 <= self.draft_cost <= 1
        ):
            raise ValueError(
                f"draft_cost must be a number in [0, 1] or None, got {self.draft_cost!r}"
            )
        if self.max_step_tokens is not None:
            _check_int("max_step_tokens", self.max_step_tokens, 1)

    @classmethod
    def coerce(cls, value: Any) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, a dict of its fields, or a method name."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(method=cast(SpeculativeMethod, value))  # checked by __post_init__
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"unknown speculative option(s) {unknown}; known: {sorted(known)}")
            return cls(**value)
        raise TypeError(
            "speculative must be None, a SpeculativeConfig, a dict of its fields or "
            f"a method name, got {type(value).__name__}"
        )

    def resolved_for(self, device_type: str) -> tuple[float, int]:
        """(draft_cost, max_step_tokens) with the device's defaults filled in (a default
        draft_cost is the verify cost alone: see draft_cost)."""
        defaults = _DEFAULTS["cuda" if device_type == "cuda" else "cpu"]
        cost = defaults["draft_cost"] if self.draft_cost is None else float(self.draft_cost)
        step = defaults["max_step_tokens"] if self.max_step_tokens is None else self.max_step_tokens
        return cost, step


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
