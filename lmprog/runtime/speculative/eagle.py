"""EagleProposer: an EAGLE-3 head drafts from the target's hidden states.

Draft position i is fed the target's features at token i (three layers' hidden states,
projected by the head's `fc`) and the embedding of token i + 1; its output predicts token
i + 2 and is fed back as the features of the next position while drafting:

    token index:   ... c-1 | c ........ n-2 | n-1    n      ...  n+k-3   (n = len(tokens))
    draft fed:         kept | target feats  | own    own          own
                            | + tokens c+1..n-1  + d1    + d2  ...  + d_{k-1}
    exact KV:      base .. c-1 (target features, kept across calls) | redone every call

Per request the proposer keeps draft KV for token indices base .. base + exact - 1 computed
from target features (exact: they never change, the tokens after them being final) and the
features observed but not fed yet. A call feeds those in one batched extend (draft 1 comes
from its last row), then k - 1 batched one-token steps on the head's own states; the
previous call's fed drafts are dropped first. Drafts are the argmax (chains) or the top-w
per depth (trees, tree_width: a tree of k nodes runs ceil(k / w) steps), mapped to the
target's ids by d2t; no draft distribution is
returned, so a sampled request is verified as n-gram drafts are (its distribution kept).
Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from ..executor.forward_batch import ForwardBatch
from ..executor.kv_pool import KVPool
from ..models.llama import HiddenCapture
from .draft import KV_BUDGET_BYTES, _checked_tokens, prepare_and_run
from .draft_cache import DraftKVCache, DraftSeq
from .head_proposer import HeadProposer, tree_depth, tree_nodes
from .heads import Eagle3Head
from .proposer import Proposal, ProposalInput

_EMPTY = Proposal(())


@dataclass(eq=False)
class _State:
    """One request: draft KV for token indices base .. base + exact - 1 (seq's first exact
    entries; entries beyond are the last call's fed drafts), and observed features of token
    indices base + exact .. base + exact + len(pending) - 1."""

    base: int
    pending: torch.Tensor
    exact: int = 0
    seq: DraftSeq | None = None

    @property
    def next_index(self) -> int:
        return self.base + self.exact


@dataclass(eq=False)
class _Job:
    inp: ProposalInput
    state: _State
    seq: DraftSeq
    feed: int  # target features fed this call (token indices next_index .. n - 2)
    k: int
    top: list[list[int]] = field(default_factory=list)


class EagleProposer(HeadProposer):
    """Drafts with `head` (an Eagle3Head on the target's device) for a target whose
    capture_layers the engine captures. vocab_size: the target's; tree_width: 1 for chains,
    w > 1 for trees of the top-w tokens per depth (see head_proposer.tree_nodes).
    max_total_tokens / max_requests / context_length: the head's KV pool, as a draft model's
    (DraftModelProposer). propose() never fails for lack of memory (empty proposals)."""

    def __init__(
        self,
        head: Eagle3Head,
        *,
        capture_layers: tuple[int, ...],
        vocab_size: int,
        tree_width: int = 1,
        max_total_tokens: int | None = None,
        max_requests: int = 64,
        context_length: int | None = None,
    ) -> None:
        c = head.config.layer
        if c.vocab_size != vocab_size:
            raise ValueError(
                f"the EAGLE-3 head embeds {c.vocab_size} tokens, the target has {vocab_size}"
            )
        if len(capture_layers) != 3:
            raise ValueError(f"EAGLE-3 reads 3 target layers, got {capture_layers}")
        param = next(head.parameters())
        self.head, self.device, self.dtype = head, param.device, param.dtype
        self.capture = HiddenCapture(tuple(capture_layers))
        self.vocab_size, self.tree_width = vocab_size, tree_width
        self.context_length = context_length or c.max_position
        if max_total_tokens is None:
            budget = KV_BUDGET_BYTES.get(self.device.type, KV_BUDGET_BYTES["cpu"])
            max_total_tokens = min(KVPool.size_for_budget(budget, c, self.dtype), 1 << 20)
        self.kv = KVPool(max_total_tokens, 1, c.num_kv_heads, c.head_dim, self.dtype, self.device)
        self.cache = DraftKVCache(max_total_tokens, max_requests)
        self.req_to_token = torch.zeros(
            (max_requests, self.context_length), dtype=torch.int32, device=self.device
        )
        head.attention.warm_up(self.kv, self.req_to_token)
        self.max_states = 4 * max_requests  # observed requests kept (LRU beyond)
        self._states: OrderedDict[Hashable, _State] = OrderedDict()
        self.num_proposed = 0
        self.num_skipped = 0  # proposals left empty: no features, no memory, too long

    # ---- HeadProposer ----------------------------------------------------------------------
    def observe(self, rid: Hashable, start: int, rows: torch.Tensor) -> None:
        st = self._states.get(rid)
        if st is not None:
            self._states.move_to_end(rid)
            end = st.next_index + len(st.pending)
            if st.next_index <= start <= end:  # continues (overwriting rejected drafts' rows)
                st.pending = torch.cat([st.pending[: start - st.next_index], rows])
                return
            if st.base <= start < st.next_index:  # recomputed: roll the exact KV back
                st.exact = start - st.base
                if st.seq is not None and self.cache.get(rid) is st.seq:
                    self.cache.truncate(st.seq, min(st.exact, len(st.seq.tokens)))
                st.pending = rows
                return
            self.release(rid)  # a gap (tokens fed without capture): start over from here
        self._states[rid] = _State(start, rows)
        while len(self._states) > self.max_states:
            self.release(next(iter(self._states)))

    def propose(self, inputs: Sequence[ProposalInput]) -> list[Proposal]:
        # on a failure, half-updated states: those requests start over
        jobs = prepare_and_run(inputs, self._prepare, self._run, lambda j: self.release(j.inp.rid))
        out = [_EMPTY if j is None else tree_nodes(j.top, self.tree_width) for j in jobs]
        self.num_proposed += sum(len(p.token_ids) for p in out)
        return out

    def release(self, rid: Hashable) -> None:
        self._states.pop(rid, None)
        self.cache.release(rid)

    def stats(self) -> dict[str, int]:
        return {
            "draft_requests": len(self.cache),
            "draft_free_slots": self.cache.num_free_slots,
            "draft_tokens_proposed": self.num_proposed,
            "draft_skipped": self.num_skipped,
        }

    # ---- one call --------------------------------------------------------------------------
    def _prepare(self, inp: ProposalInput, protect: set[Hashable]) -> _Job | None:
        tokens = _checked_tokens(inp)
        n = len(tokens)
        st = self._states.get(inp.rid)
        # features needed for token indices next_index .. n - 2 (n - 1 is not fed yet; after
        # a jump-forward several are not, and the head has no features for them)
        feed = -1 if st is None else n - 1 - st.next_index
        if st is None or feed < 1 or feed > len(st.pending):
            self.num_skipped += 1
            return None
        depth = tree_depth(inp.max_tokens, self.tree_width)  # head steps: k
        k = min(depth, self.context_length - (n - 1 - st.base) - 1)
        if k < 1:
            self.num_skipped += 1
            return None
        seq = st.seq
        if seq is None or self.cache.get(inp.rid) is None:  # new, or evicted: start after
            seq = st.seq = self.cache.open(inp.rid, protect)  # what the pool dropped
            if seq is None:
                self.num_skipped += 1
                return None
            if st.exact:  # the evicted KV is gone: restart at the features still held
                st.base, st.exact = st.next_index, 0
        self.cache.truncate(seq, st.exact)  # the last call's fed drafts
        if self.cache.reserve(seq, feed + k - 1, protect) is None:
            self.num_skipped += 1
            return None
        return _Job(inp, st, seq, feed, k)

    def _run(self, jobs: list[_Job]) -> None:
        head, dev = self.head, self.device
        ids, pos, loc, rows, lens, ext = [], [], [], [], [], []
        feats = []
        for j in jobs:
            st, tokens = j.state, j.inp.token_ids
            first = st.next_index  # token index of the first fed feature
            cols = range(st.exact, st.exact + j.feed)
            ids += [int(tokens[first + 1 + i]) for i in range(j.feed)]
            pos += [first + i for i in range(j.feed)]
            loc += [j.seq.slots[c] for c in cols]
            rows.append(j.seq.row)
            lens.append(st.exact + j.feed)
            ext.append(j.feed)
            feats.append(st.pending[: j.feed])
        self._fill_table(jobs)
        batch = ForwardBatch.build(
            input_ids=ids,
            positions=pos,
            out_cache_loc=loc,
            req_pool_indices=rows,
            seq_lens=lens,
            extend_lens=ext,
            req_to_token=self.req_to_token,
            device=dev,
        )
        logits, hidden = head(batch, self.kv, torch.cat(feats).to(self.dtype), project=True)
        for j in jobs:  # the features are in the exact KV now
            j.seq.tokens.extend(int(t) for t in j.inp.token_ids[j.state.next_index + 1 :])
            j.state.pending = j.state.pending[j.feed :]
            j.state.exact += j.feed
        fed = self._choose(jobs, logits, 0)
        for s in range(1, jobs[0].k):
            now = [j for j in jobs if j.k > s]
            batch = self._step_batch(now, s, fed[: len(now)])
            logits, hidden = head(batch, self.kv, hidden[: len(now)], project=False)
            fed = self._choose(now, logits, s)
        for j in jobs:
            j.seq.tokens.extend(t[0] for t in j.top[:-1])  # fed back: their KV is in the pool
            assert len(j.seq.tokens) == len(j.seq.slots)

    def _choose(self, jobs: list[_Job], logits: torch.Tensor, s: int) -> torch.Tensor:
        """The top candidates of each job's row (target ids); returns the top-1 ids to feed."""
        w = min(self.tree_width, logits.shape[-1])
        top = self.head.target_ids(logits.topk(w, dim=-1).indices)  # [rows, w]
        host = top.tolist()
        for j, cands in zip(jobs, host):
            j.top.append([int(t) for t in cands])
        return top[:, 0]

    def _step_batch(self, jobs: list[_Job], s: int, ids: torch.Tensor) -> ForwardBatch:
        """Draft step s (>= 1): each job feeds its draft s at token index n - 2 + s."""
        n = [len(j.inp.token_ids) for j in jobs]
        cols = [j.state.exact - 1 + s for j in jobs]  # the draft row's column of index n-2+s
        return ForwardBatch.build(
            input_ids=ids,
            positions=[m - 2 + s for m in n],
            out_cache_loc=[j.seq.slots[c] for j, c in zip(jobs, cols)],
            req_pool_indices=[j.seq.row for j in jobs],
            seq_lens=[c + 1 for c in cols],
            extend_lens=[1] * len(jobs),
            req_to_token=self.req_to_token,
            device=self.device,
        )

    def _fill_table(self, jobs: list[_Job]) -> None:
        """The draft table rows: column c holds the slot of the request's c-th draft entry."""
        for j in jobs:
            start = j.state.exact
            slots = j.seq.slots[start:]
            self.req_to_token[j.seq.row, start : start + len(slots)] = torch.tensor(
                slots, dtype=torch.int32
            ).to(self.device)
