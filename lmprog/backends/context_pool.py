"""Lend llama.cpp contexts to requests and bring each to a token sequence as cheaply as possible.

To reach a target sequence a context either keeps the common prefix of what it already holds
(its "live" tokens) or restores the saved state that shares the longest prefix, whichever
leaves less to evaluate, then evaluates the rest:

    live:    [sys shots q1 a1]          target: [sys shots q2]
    keep [sys shots], drop [q1 a1], evaluate [q2]

Before a context throws away at least `min_save_tokens` of work (another conversation
takes it over), that work is saved in the `StateCache`, so interleaved multi-turn programs
and forks find it again later. `cache_prefix` saves explicitly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmprog.backends.llamacpp_native import NativeContext
from lmprog.backends.state_cache import StateCache, common_prefix_len
from lmprog.core.errors import BackendError


@dataclass(frozen=True)
class Advanced:
    """What `advance` did: logits of the requested positions and how much it reused."""

    logits: np.ndarray | None  # [n, V] for target[logits_from:], None if not asked
    reused: int  # leading tokens of the target not evaluated (live KV or a restored state)
    restored: bool  # the reused tokens came from a saved state


class ContextPool:
    """A fixed set of contexts, each lent to one request at a time. Thread-safe.

    Contract: inside `lease`, the caller owns the context exclusively; `advance` leaves
    `ctx.tokens == target` on success and a consistent (possibly empty) context on error.
    """

    def __init__(
        self, contexts: Sequence[NativeContext], cache: StateCache, *, min_save_tokens: int = 64
    ):
        assert contexts, "a pool needs at least one context"
        self._contexts = list(contexts)
        self._idle = list(contexts)
        self._closed = False
        self._cond = threading.Condition()
        self.cache = cache
        self.min_save_tokens = min_save_tokens
        self._stats_lock = threading.Lock()
        self._counts = {"evaluated_tokens": 0, "restores": 0, "saves_on_switch": 0}

    @property
    def n_ctx(self) -> int:
        return self._contexts[0].n_ctx

    @contextmanager
    def lease(self, tokens: Sequence[int]) -> Iterator[NativeContext]:
        """Borrow the idle context that already holds the longest prefix of `tokens`."""
        with self._cond:
            while not self._idle and not self._closed:
                self._cond.wait()
            if self._closed:
                raise BackendError("the backend was shut down")
            ctx = max(self._idle, key=lambda c: _common(c.tokens, tokens))
            self._idle.remove(ctx)
        try:
            yield ctx
        finally:
            with self._cond:
                self._idle.append(ctx)
                self._cond.notify_all()

    def advance(
        self, ctx: NativeContext, target: Sequence[int], logits_from: int | None = None
    ) -> Advanced:
        """Make `ctx` hold exactly `target`; return the logits of target[logits_from:].

        At most `logits_from` leading tokens are reused (their logits are not kept), so
        `logits_from=len(target) - 1` gives the next-token logits after the target.
        """
        assert len(target) <= ctx.n_ctx, "the backend checks the context length first"
        limit = len(target) if logits_from is None else logits_from
        assert 0 <= limit <= len(target)
        keep = min(_common(ctx.tokens, target), limit)
        restored = keep < limit and self._maybe_restore(ctx, target, keep, limit)
        # After a restore the context holds exactly the reusable prefix; after a failed
        # one it may have been cleared.
        keep = len(ctx.tokens) if restored else min(keep, len(ctx.tokens))
        if keep < len(ctx.tokens):
            self._save_before_dropping(ctx, keep)
            ctx.truncate(keep)
            keep = len(ctx.tokens)  # truncate may clear everything (model cannot drop a tail)
        rest = list(target[keep:])
        logits = (
            ctx.eval(rest, None if logits_from is None else logits_from - keep) if rest else None
        )
        self._count(evaluated_tokens=len(rest))
        return Advanced(logits, keep, restored)

    def save(self, ctx: NativeContext) -> bool:
        """Save the context's state under its tokens unless the cache already holds them all."""
        if (
            not ctx.tokens
            or self.cache.max_bytes == 0
            or self.cache.longest_common(ctx.tokens) >= len(ctx.tokens)
        ):
            return False
        return self.cache.put(ctx.tokens, ctx.save_state())

    def _maybe_restore(
        self, ctx: NativeContext, target: Sequence[int], keep: int, limit: int
    ) -> bool:
        """Restore the best saved state if it beats the live prefix by enough to pay the copy."""
        if self.cache.max_bytes == 0 or len(self.cache) == 0:
            return False
        match = self.cache.lookup(target, min_common=keep + 1)
        if match is None:
            return False
        usable = min(match.common, limit)
        # A restore copies the whole state (docs/benchmarks.md) while evaluating costs
        # milliseconds per token: worth it unless the gain is tiny.
        if usable - keep < max(4, len(match.state.tokens) // 256):
            return False
        self._save_before_dropping(ctx, 0)
        ctx.load_state(match.state.blob, match.state.tokens)
        ctx.truncate(usable)
        if len(ctx.tokens) != usable:  # the model could not drop the tail
            ctx.clear()
            return False
        self._count(restores=1)
        return True

    def _save_before_dropping(self, ctx: NativeContext, keep: int) -> None:
        if len(ctx.tokens) - keep >= self.min_save_tokens and self.save(ctx):
            self._count(saves_on_switch=1)

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():
                self._counts[k] += v

    def stats(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self._counts)

    def close(self, model: Any = None) -> None:
        """Wait for every lease to end, free the contexts (then `model`, if given). Idempotent."""
        with self._cond:
            self._closed = True
            while len(self._idle) < len(self._contexts):
                self._cond.wait()
            for ctx in self._contexts:
                ctx.close()
        if model is not None:
            model.close()


def _common(live: Sequence[int], target: Sequence[int]) -> int:
    """Common prefix length, with a fast path for the usual case of a target extending `live`."""
    n = len(live)
    if n <= len(target) and list(target[:n]) == live:
        return n
    return common_prefix_len(live, target)
