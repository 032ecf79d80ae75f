"""The sequence slots of one llama.cpp context: which slot a request gets, and how cheaply
it reaches its prompt. Its own common prefix, another slot's copied cells, or a saved state.

Idle slots keep their tokens as a prefix cache; work about to be thrown away is saved in the
StateCache. Engine thread only; `stats()` from any thread.
Design: docs/design/llamacpp-backend.md.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from lmprog.backends.llamacpp_native import NativeContext
from lmprog.backends.state_cache import SavedState, StateCache, common_prefix_len


@dataclass(frozen=True)
class Lease:
    """A slot lent to a request, holding the first `reused` tokens of its target."""

    slot: int
    reused: int  # leading target tokens already in the slot (live, copied or restored)
    restored: bool  # they came from a saved state


class SequencePool:
    """Contract: `acquire` leases a free slot holding a prefix of the target (never more
    than `limit` tokens of it); a leased slot belongs to its request until `release`.

    LoRA: KV computed under one adapter is never served to another. Each slot records the
    adapter its KV was computed under (`adapter_of`, uid; 0: the base model), prefixes are
    shared only between slots of one adapter, and a saved state's key starts with a marker
    of its adapter (`-uid`, never a token id), so lookups under another adapter share
    nothing with it."""

    def __init__(self, ctx: NativeContext, cache: StateCache, *, min_save_tokens: int = 64):
        self.ctx = ctx
        self.cache = cache
        self.min_save_tokens = min_save_tokens
        self._leased: set[int] = set()
        self._clock = itertools.count()
        self._last_used = [0] * ctx.n_seq  # for LRU choice among idle slots
        self.adapter_of = [0] * ctx.n_seq  # the adapter each slot's KV was computed under
        self._stats_lock = threading.Lock()
        self._counts = dict.fromkeys(_COUNTS, 0)

    @property
    def n_free(self) -> int:
        return self.ctx.n_seq - len(self._leased)

    def acquire(self, target: Sequence[int], limit: int, adapter: int = 0) -> Lease | None:
        """Lease the free slot that reaches the longest prefix of target[:limit] computed
        under `adapter` (uid, 0: none); None if every slot is leased."""
        free = [s for s in range(self.ctx.n_seq) if s not in self._leased]
        if not free:
            return None
        tokens = self.ctx.tokens

        def reach(s: int) -> int:
            if self.adapter_of[s] != adapter:
                return 0
            return min(_common(tokens[s], target), limit)

        own = {s: reach(s) for s in free}
        slot = max(free, key=lambda s: (own[s], -self._last_used[s]))
        keep = own[slot]
        if keep == 0:
            slot = min(free, key=lambda s: (len(tokens[s]) > 0, self._last_used[s]))
        if self.adapter_of[slot] != adapter:  # its KV is another adapter's: kept saved
            self._save_before_dropping(slot, 0)
            self.ctx.truncate(slot, 0)
            self.adapter_of[slot] = adapter
        src = max(range(self.ctx.n_seq), key=reach)
        shared = reach(src)
        if shared > keep and src != slot:
            self._save_before_dropping(slot, 0)
            self.ctx.copy_prefix(src, slot, shared)
            keep = shared
            self.count(prefix_copies=1)
        restored = keep < limit and self._maybe_restore(slot, target, keep, limit, adapter)
        keep = len(tokens[slot]) if restored else keep
        self._save_before_dropping(slot, keep)
        self.ctx.truncate(slot, keep)
        self._leased.add(slot)
        return Lease(slot, keep, restored)

    def release(self, slot: int) -> None:
        self._leased.discard(slot)
        self._last_used[slot] = next(self._clock)

    def retract(self, slot: int, keep: int) -> SavedState | None:
        """Take a slot back from its request to free KV cells: the state of its first `keep`
        tokens, for `resume` (None if it held none). Kept by the request, not in the shared
        StateCache, which may evict it or skip a short one: a resumed request continues from
        the very KV it had, not from a re-evaluation that llama.cpp rounds differently in a
        batch of another size."""
        tokens = self.ctx.tokens[slot][:keep]
        saved = None
        if tokens:
            self.ctx.truncate(slot, len(tokens))
            saved = SavedState(tuple(tokens), self.ctx.save_state(slot))  # the job's adapter
        self.ctx.truncate(slot, 0)
        self.release(slot)
        return saved

    def resume(self, saved: SavedState, adapter: int = 0) -> Lease | None:
        """Lease a free slot holding exactly a retracted request's state (computed under
        `adapter`; idle slots emptied to make room); None while no slot is free or the KV
        cells have no room for it."""
        free = [s for s in range(self.ctx.n_seq) if s not in self._leased]
        if not free:
            return None
        tokens = self.ctx.tokens
        slot = min(free, key=lambda s: (len(tokens[s]) > 0, self._last_used[s]))
        self._save_before_dropping(slot, 0)
        while not self.ctx.load_state(slot, saved.blob, saved.tokens):
            if not self.evict_idle():
                return None
        self.adapter_of[slot] = adapter
        self._leased.add(slot)
        self.count(restores=1)
        return Lease(slot, len(saved.tokens), True)

    def evict_idle(self) -> bool:
        """Empty the least recently used idle slot that holds tokens (saving them first);
        False if there is none."""
        idle = [s for s in range(self.ctx.n_seq) if s not in self._leased and self.ctx.tokens[s]]
        if not idle:
            return False
        slot = min(idle, key=lambda s: self._last_used[s])
        self._save_before_dropping(slot, 0)
        self.ctx.truncate(slot, 0)
        return True

    def save(self, slot: int) -> bool:
        """Save the slot's state under its tokens unless the cache already holds them all."""
        tokens = self.ctx.tokens[slot]
        key = _key(tokens, self.adapter_of[slot])
        if not tokens or self.cache.max_bytes == 0 or self.cache.longest_common(key) >= len(key):
            return False
        return self.cache.put(key, self.ctx.save_state(slot))

    def _maybe_restore(
        self, slot: int, target: Sequence[int], keep: int, limit: int, adapter: int
    ) -> bool:
        """Restore the best saved state of `adapter` if it beats the live prefix by enough
        to pay the copy."""
        if self.cache.max_bytes == 0 or len(self.cache) == 0:
            return False
        marker = len(_key((), adapter))
        match = self.cache.lookup(_key(target, adapter), min_common=keep + 1 + marker)
        if match is None:
            return False
        usable = min(match.common - marker, limit)
        # A restore copies the whole state (docs/benchmarks.md) while evaluating costs
        # milliseconds per token: worth it unless the gain is tiny.
        if usable - keep < max(4, len(match.state.tokens) // 256):
            return False
        self._save_before_dropping(slot, 0)
        tokens = match.state.tokens[marker:]
        if not self.ctx.load_state(slot, match.state.blob, tokens):
            return False  # no room in the KV cells: evaluate instead
        self.ctx.truncate(slot, usable)
        disk = usable - keep if match.from_disk else 0
        self.count(restores=1, restored_tokens=usable - keep, disk_restored_tokens=disk)
        return True

    def _save_before_dropping(self, slot: int, keep: int) -> None:
        if len(self.ctx.tokens[slot]) - keep >= self.min_save_tokens and self.save(slot):
            self.count(saves_on_switch=1)

    def count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():
                self._counts[k] += v

    def stats(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self._counts)


_COUNTS = (
    "evaluated_tokens",
    "decode_calls",  # llama_decode calls (one per engine step)
    "restores",  # saved states restored into a slot
    "restored_tokens",  # tokens the states restored from the cache spared evaluating
    "disk_restored_tokens",  # of those, the ones from states read back from its disk tier
    "prefix_copies",  # prefixes shared from another slot (seq_cp)
    "saves_on_switch",  # states saved before a slot dropped them
    "num_retractions",  # requests that gave their KV cells back (none free) and waited
)


def _key(tokens: Sequence[int], adapter: int) -> Sequence[int]:
    """A saved state's key: its tokens, after a marker of its LoRA adapter (-uid; none for
    the base model, so base keys are the tokens alone)."""
    return [-adapter, *tokens] if adapter else tokens


def _common(live: Sequence[int], target: Sequence[int]) -> int:
    """Common prefix length, with a fast path for the usual case of a target extending `live`."""
    n = len(live)
    if n <= len(target) and list(target[:n]) == live:
        return n
    return common_prefix_len(live, target)
