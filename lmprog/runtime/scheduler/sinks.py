"""Attention sinks, the scheduler's side: when a running request's KV is full, evict `shift`
tokens after its sinks at once. StreamingLLM; the knobs are AttentionSinkConfig's, the KV
side is cache/sinks.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..cache.manager import CacheManager
from ..cache.sinks import copies_needed, evict_middle
from ..config import AttentionSinkConfig
from ..request import Req, ReqStatus
from .requests import RequestTable


class KVShift(NamedTuple):
    """A step's KV moves, done on the device before its forward (and before anything else
    writes the pool): slot dst[i] gets slot src[i]'s value and its key rotated back by
    delta[i] positions (RoPE rotations compose: R(-d) R(p) = R(p - d)). src == dst for a
    request's own slots; every src is read before any dst is written."""

    src: np.ndarray  # int64 [N]
    dst: np.ndarray  # int64 [N]
    delta: np.ndarray  # int64 [N]

    @classmethod
    def concat(cls, moves: list[tuple[np.ndarray, np.ndarray, int]]) -> KVShift:
        src = np.concatenate([m[0] for m in moves]).astype(np.int64)
        dst = np.concatenate([m[1] for m in moves]).astype(np.int64)
        delta = np.repeat(
            np.array([m[2] for m in moves], dtype=np.int64), [len(m[0]) for m in moves]
        )
        return cls(src, dst, delta)


class SinkWindow:
    """The window arithmetic for one engine. max_len: the longest KV a request could hold
    without sinks (min(context length, KV pool))."""

    def __init__(self, config: AttentionSinkConfig, max_len: int, page_size: int) -> None:
        self.sinks = config.attention_sink_size
        self.window = config.window(max_len)
        self.limit = self.sinks + self.window  # positions a request's KV may hold
        self.shift = config.shift(self.window, page_size)
        self.page_size = page_size
        self.evicted_tokens = 0  # from running requests, since start

    def to_evict(self, req: Req) -> int:
        """Tokens to evict from req (after its sinks) before its next step: 0 while its next
        chunk fits, else `shift` (fewer when fewer lie past the sinks; whole pages). After
        the eviction at least min(pending, shift) tokens fit, since shift < window."""
        room = self.limit - req.num_computed
        if room >= min(req.pending_len, self.shift):
            return 0
        movable = req.num_computed - self.sinks
        return min(self.shift, movable - movable % self.page_size)

    def evict(
        self, requests: RequestTable, cache: CacheManager, retract_newest: Callable[[], None]
    ) -> KVShift | None:
        """Evict a chunk after the sinks of every running request whose next chunk would not
        fit its window, oldest first; return the KV moves (the tokens evicted are counted
        in evicted_tokens). Copying a kept cached prefix takes fresh slots: while they are
        not obtainable the newest request is retracted (a lone request always fits:
        unlocking that prefix makes it evictable, and the pool holds a whole window)."""
        moves, running = [], ReqStatus.RUNNING
        for req in list(requests.running_reqs()):
            delta = self.to_evict(req) if req.status is running else 0
            if not delta:
                continue
            need = copies_needed(req, self.sinks + delta)
            while req.status is running and need > cache.available_tokens:
                if requests.num_running == 1:
                    break
                retract_newest()
            if req.status is not running:
                continue
            src, dst = evict_middle(cache, req, self.sinks, delta)
            self.delete(req, delta)
            moves.append((src, dst, delta))
        self.evicted_tokens += sum(m[2] for m in moves)
        return KVShift.concat(moves) if moves else None

    def delete(self, req: Req, delta: int) -> None:
        """Drop req's evicted tokens [sinks, sinks + delta) from its token list (their KV
        is gone: cache/sinks.py evict_middle)."""
        start = self.sinks
        req.evicted_output_ids += req.token_ids[max(start, req.prompt_end) : start + delta]
        del req.token_ids[start : start + delta]
        req.prompt_end -= max(0, min(delta, req.prompt_end - start))
        req.stop_len -= delta
        req.num_evicted += delta
        # prompt logprobs were all recorded before any eviction (Scheduler.submit checks the
        # prompt fits); a resumed request must not report them at shifted positions
        req.prompt_logprob_start = None
