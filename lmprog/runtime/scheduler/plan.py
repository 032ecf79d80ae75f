"""StepPlan: the work chosen for one step so far, the KV slots it will need, and the
ScheduledBatch it becomes once complete."""

from __future__ import annotations

import numpy as np

from ..cache.allocator import SLOT_DTYPE
from ..cache.manager import CacheManager
from ..draft_tree import depths, is_chain
from ..request import Req
from .batch import ScheduledBatch, ScheduledEntry
from .sinks import KVShift

_NO_SLOTS = np.empty(0, dtype=SLOT_DTYPE)
_NO_POSITIONS = np.empty(0, dtype=np.int64)


class StepPlan:
    """Requests to run this step with their token counts. Slots are only counted here;
    `CacheManager.extend` hands them out once the plan is complete, so a plan can be
    abandoned at any point without touching the pool."""

    def __init__(self, cache: CacheManager) -> None:
        self.cache = cache
        # (req, num_new, draft_ids, draft_parents: None for a chain)
        self.items: list[tuple[Req, int, tuple[int, ...], tuple[int, ...] | None]] = []
        self.slots = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(
        self,
        req: Req,
        num_new: int,
        draft_ids: tuple[int, ...] = (),
        slots: int = -1,
        parents: tuple[int, ...] | None = None,
    ) -> None:
        """Plan num_new fed tokens for req; `slots` may pass the precomputed slot need;
        `parents`: the drafts' tree (None: a chain; see draft_parents)."""
        assert num_new >= 1
        assert parents is None or len(parents) == len(draft_ids)
        self.items.append((req, num_new, draft_ids, parents))
        self.slots += (
            slots if slots >= 0 else self.cache.tokens_to_extend(req, req.num_computed + num_new)
        )

    def memory_left(self) -> int:
        """Slots still obtainable after this plan (free + evictable - planned)."""
        return self.cache.available_tokens - self.slots

    def add_decodes(self, reqs: list[Req]) -> None:
        """Plan one fed token for each of reqs, whose slots were reserved already."""
        self.items.extend([(req, 1, (), None) for req in reqs])

    def reserve(self, slots: int) -> None:
        """Count slots as taken before the items that use them are added (with slots=0)."""
        self.slots += slots

    def max_chunk(self, req: Req, want: int, extra_room: int = 0) -> int:
        """The most tokens (<= want) req can be fed within memory_left() + extra_room (and,
        with attention sinks, within its window)."""
        left = self.memory_left() + extra_room
        pages_room = left - left % self.cache.page_size
        most = min(want, req.num_allocated - req.num_computed + pages_room)
        if self.cache.kv_limit is not None:
            most = min(most, self.cache.kv_limit - req.num_computed)
        return max(0, most)

    def fitting_drafts(
        self, req: Req, num_real: int, budget_tokens: int, extra_room: int = 0
    ) -> tuple[int, ...]:
        """The prefix of req.draft_ids that can follow its num_real pending tokens in one
        verify entry: at most budget_tokens of them, at most remaining_tokens - 1 (a verify
        yields one token more than the drafts it accepts), and within memory (the pending
        tokens' own slots counted first; extra_room as in max_chunk)."""
        cap = min(len(req.draft_ids), budget_tokens, req.remaining_tokens - 1)
        if cap <= 0:
            return ()
        k = self.max_chunk(req, num_real + cap, extra_room) - num_real
        return tuple(req.draft_ids[:k]) if k > 0 else ()

    @staticmethod
    def draft_parents(req: Req, k: int) -> tuple[int, ...] | None:
        """The tree of req's first k drafts (a prefix of a tree in topological order is a
        tree), None when they form a chain."""
        parents = req.draft_parents
        if parents is None or k == 0:
            return None
        parents = tuple(parents[:k])
        return None if is_chain(parents) else parents

    def to_batch(self, retracted: list[Req], shift: KVShift | None = None) -> ScheduledBatch:
        """Allocate the planned requests' slots (CacheManager.extend: evicting cached
        prefixes as needed, rows of req_to_token written) and describe the step. Mutates
        every planned request's num_allocated, row_dirty and extend_len."""
        items = self.items
        if not items:
            return ScheduledBatch((), _NO_SLOTS, _NO_POSITIONS, tuple(retracted), shift)
        reqs, counts, _, _ = zip(*items)
        out_slots, positions = self.cache.extend(reqs, counts)
        entries, offset = [], 0
        new_entry = ScheduledEntry._make  # no argument parsing in this per-request loop
        for req, n, drafts, parents in items:
            start = req.num_computed
            end = start + n
            real_end = end - len(drafts)
            seq_len = len(req.token_ids)
            sample = real_end == seq_len and seq_len < req.stop_len
            logits_from = real_end - 1 if sample else None
            if req.prompt_logprob_start is not None and req.prompt_logprob_start < end:
                first = max(start, req.prompt_logprob_start)
                logits_from = first if logits_from is None else min(logits_from, first)
            entries.append(
                new_entry(
                    (
                        req,
                        req.row,
                        start,
                        n,
                        offset,
                        logits_from,
                        sample,
                        req.row_dirty,
                        drafts,
                        req.num_evicted,
                        parents,
                    )
                )
            )
            if parents is not None:  # a tree: draft i sits at the root's position + 1 + depth
                first = offset + n - len(drafts)
                positions[first : offset + n] = positions[first] + np.asarray(depths(parents))
            req.row_dirty = False
            req.extend_len = n
            offset += n
        return ScheduledBatch(tuple(entries), out_slots, positions, tuple(retracted), shift)
