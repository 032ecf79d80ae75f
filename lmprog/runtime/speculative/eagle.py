"""EagleProposer: an EAGLE head (EAGLE-3, or EAGLE-1/2) drafts from the target's hidden states.

Draft position i is fed the target's features at token i (EAGLE-3: three layers' hidden
states; EAGLE-1: the last layer's; the head maps them to its input) and the embedding of
token i + 1; its output predicts token
i + 2 and is fed back as the features of the next position while drafting:

    token index:   ... c-1 | c ........ n-2 | n-1    n      ...  n+k-3   (n = len(tokens))
    draft fed:         kept | target feats  | own    own          own
                            | + tokens c+1..n-1  + d1    + d2  ...  + d_{k-1}
    exact KV:      base .. c-1 (target features, kept across calls) | redone every call

Per request the proposer keeps draft KV for token indices base .. base + exact - 1 computed
from target features (exact: they never change, the tokens after them being final) and the
features observed but not fed yet. A call feeds those in one batched extend (draft 1 comes
from its last row), then k - 1 batched one-token steps on the head's own states (the
call's integers go to the device in one copy and its drafts come back in one); the
previous call's fed drafts are dropped first. Drafts are the argmax (chains) or the top-w
per depth (trees, tree_width: a tree of k nodes runs ceil(k / w) steps), mapped to the
target's ids by d2t. With tree_depth the tree is EAGLE-2's dynamic one (`_grow`): each of
the tree_depth - 1 steps feeds the w drafts of best cumulative probability of the last depth
in one extend whose attention is masked by the tree (each sees the exact KV and its own
ancestors), their top w children come back with their log probabilities, and the best k of
all drafts are proposed (head_proposer.DynamicTree); eager steps, one read-back each. No
draft distribution is
returned, so a sampled request is verified as n-gram drafts are (its distribution kept).
Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from ..draft_tree import ROOT
from ..executor.cuda_graph import CudaGraphRunner, capture_decode_graphs
from ..executor.forward_batch import ForwardBatch
from ..executor.kv_pool import KVPool
from ..models.llama import HiddenCapture
from .draft import KV_BUDGET_BYTES, _checked_tokens, prepare_and_run
from .draft_cache import DraftKVCache, DraftSeq
from .draft_job import DraftTable, Packer
from .head_proposer import DynamicTree, HeadProposer, tree_depth, tree_nodes
from .heads import EagleHead
from .proposer import Proposal, ProposalInput

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

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
    tree: DynamicTree | None = None


class EagleProposer(HeadProposer):
    """Drafts with `head` (an Eagle3Head or Eagle1Head on the target's device) for a target whose
    capture_layers the engine captures. vocab_size: the target's; tree_width: 1 for chains,
    w > 1 for trees of the top-w tokens per depth (see head_proposer.tree_nodes); tree_depth:
    EAGLE-2's dynamic trees of that many depths instead (see _grow).
    max_total_tokens / max_requests / context_length: the head's KV pool, as a draft model's
    (DraftModelProposer). propose() never fails for lack of memory (empty proposals)."""

    def __init__(
        self,
        head: EagleHead,
        *,
        capture_layers: tuple[int, ...],
        vocab_size: int,
        tree_width: int = 1,
        tree_depth: int | None = None,
        max_total_tokens: int | None = None,
        max_requests: int = 64,
        context_length: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        c = head.config.layer
        if c.vocab_size != vocab_size:
            raise ValueError(
                f"the EAGLE head embeds {c.vocab_size} tokens, the target has {vocab_size}"
            )
        if len(capture_layers) != head.reads:
            raise ValueError(
                f"{type(head).__name__} reads {head.reads} target layers, got {capture_layers}"
            )
        param = next(head.parameters())
        self.head, self.device, self.dtype = head, param.device, param.dtype
        self.capture = HiddenCapture(tuple(capture_layers))
        self.vocab_size, self.tree_width, self.tree_depth = vocab_size, tree_width, tree_depth
        # the children each expanded node of a dynamic tree gets (and the nodes fed per depth)
        self.expand = min(tree_width, getattr(head.config, "draft_vocab_size", c.vocab_size))
        self.context_length = context_length or c.max_position
        if max_total_tokens is None:
            budget = KV_BUDGET_BYTES.get(self.device.type, KV_BUDGET_BYTES["cpu"])
            max_total_tokens = min(KVPool.size_for_budget(budget, c, self.dtype), 1 << 20)
        self.kv = KVPool(max_total_tokens, 1, c.num_kv_heads, c.head_dim, self.dtype, self.device)
        self.cache = DraftKVCache(max_total_tokens, max_requests)
        self.table = DraftTable(max_requests, self.context_length, self.device)
        self.req_to_token = self.table.req_to_token
        head.attention.warm_up(self.kv, self.req_to_token)
        # the draft steps (one token per request, the head's own states) replayed from decode
        # graphs on a GPU with Triton attention (None elsewhere: eager)
        self.step = HeadStep(head, max_requests)
        self.graphs: CudaGraphRunner | None = None
        if cuda_graphs:
            self.graphs = capture_decode_graphs(  # (what the graphs call of a model)
                cast("LlamaForCausalLM", self.step),
                self.kv,
                self.req_to_token,
                max_batch_size=max_requests,
            )
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
        out = [_EMPTY if j is None else self._proposal(j) for j in jobs]
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
        room = self.context_length - (n - 1 - st.base) - 1  # draft columns left
        if self.tree_depth is None:
            k = min(tree_depth(inp.max_tokens, self.tree_width), room)  # head steps: k
        else:  # a dynamic tree: steps after the first feed `expand` nodes each
            k = min(self.tree_depth, inp.max_tokens, 1 + (room - 1) // self.expand)
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
        fed = k - 1 if self.tree_depth is None else (k - 1) * self.expand
        if self.cache.reserve(seq, feed + fed, protect) is None:
            self.num_skipped += 1
            return None
        return _Job(inp, st, seq, feed, k)

    def _run(self, jobs: list[_Job]) -> None:
        """The extend of every job's new features, then the draft steps; every integer of
        the call sent to the device in one copy, the drafts read back in one (as the draft
        model's proposer does: draft_job.pack_steps)."""
        head = self.head
        active = [sum(j.k > s for j in jobs) for s in range(jobs[0].k)]  # jobs sorted by k
        if self.tree_depth is not None:
            active = active[:1]  # the extend only: _grow packs its own steps
        ints = self._pack(jobs, active).send(self.device)
        self.req_to_token[ints["t_rows"], ints["t_cols"]] = ints["t_vals"].to(torch.int32)
        feats = torch.cat([j.state.pending[: j.feed] for j in jobs]).to(self.dtype)
        batch = self.table.extend_batch(
            ints, tuple(j.state.exact + j.feed for j in jobs), tuple(j.feed for j in jobs)
        )
        logits, hidden = head(batch, self.kv, feats, project=True)
        for j in jobs:  # the features are in the exact KV now
            j.seq.tokens.extend(int(t) for t in j.inp.token_ids[j.state.next_index + 1 :])
            j.state.pending = j.state.pending[j.feed :]
            j.state.exact += j.feed
        if self.tree_depth is not None:
            self._grow(jobs, logits, hidden)
            return
        top = self._top(logits)
        tops = [top]
        for s in range(1, len(active)):
            a = active[s]
            batch = self.table.one_token_batch(
                top[:a, 0],
                ints[f"pos{s}"],
                ints[f"loc{s}"],
                ints["rows"][:a],
                ints[f"lens{s}"],
                [j.state.exact + s for j in jobs[:a]],
            )
            logits, hidden = self._draft_step(batch, hidden[:a])
            top = self._top(logits)
            tops.append(top)
        flat = torch.cat(tops).tolist()  # [sum(active), w]: the call's one read-back
        at = 0
        for a in active:
            for j, cands in zip(jobs[:a], flat[at : at + a]):
                j.top.append([int(t) for t in cands])
            at += a
        for j in jobs:
            j.seq.tokens.extend(t[0] for t in j.top[:-1])  # fed back: their KV is in the pool
            assert len(j.seq.tokens) == len(j.seq.slots)

    def _proposal(self, job: _Job) -> Proposal:
        if job.tree is not None:
            return job.tree.proposal(job.inp.max_tokens)
        return tree_nodes(job.top, self.tree_width)

    def _grow(self, jobs: list[_Job], logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """EAGLE-2's dynamic trees from the extend's logits and states (row r: job r's root).
        Step s feeds each job's frontier (depth s - 1) at position n - 2 + s into draft
        columns exact + (s - 1) * w .. exact + s * w - 1, every node seeing the exact KV and
        its ancestors' columns (the verify step's tree mask), fed the state of the row that
        drafted it; all its rows' top w come back with their log probabilities."""
        w = self.expand
        logps, ids = self._scored(logits)
        src: list[dict[int, int]] = []  # per job: node -> the row of `hidden` that drafted it
        cols: list[dict[int, int]] = [{} for _ in jobs]  # per job: fed node -> its column
        for r, (j, lp, t) in enumerate(zip(jobs, logps, ids)):
            j.tree = DynamicTree(w)
            j.tree.add(ROOT, t, lp)
            src.append(dict.fromkeys(j.tree.frontier, r))
        for s in range(1, max(j.k for j in jobs)):
            now = [r for r, j in enumerate(jobs) if j.k > s]
            feed_ids: list[int] = []
            pos: list[int] = []
            loc: list[int] = []
            rows_in: list[int] = []
            masks: list[np.ndarray] = []
            for r in now:
                j, tree = jobs[r], cast(DynamicTree, jobs[r].tree)
                exact, first = j.state.exact, j.state.exact + (s - 1) * w  # first fed column
                block = np.zeros((w, first + w), dtype=np.bool_)
                block[:, :exact] = True
                for i, node in enumerate(tree.frontier):
                    cols[r][node] = first + i
                    for a in tree.ancestors(node):  # all fed before it, or itself
                        block[i, cols[r][a]] = True
                    feed_ids.append(tree.tokens[node])
                    rows_in.append(src[r][node])
                pos += [len(j.inp.token_ids) - 2 + s] * w
                loc += j.seq.slots[first : first + w]
                masks.append(block.reshape(-1))
            lens = [jobs[r].state.exact + s * w for r in now]
            offsets = np.cumsum([0, *[m.size for m in masks[:-1]]]).tolist()
            batch = ForwardBatch.build(
                input_ids=feed_ids,
                positions=pos,
                out_cache_loc=loc,
                req_pool_indices=[jobs[r].seq.row for r in now],
                seq_lens=lens,
                extend_lens=[w] * len(now),
                req_to_token=self.req_to_token,
                logits_indices=range(len(feed_ids)),
                custom_mask=torch.from_numpy(np.concatenate(masks)),
                mask_indptr=offsets,
                device=self.device,
            )
            rows = torch.tensor(rows_in, dtype=torch.int64, device=self.device)
            logits, hidden = self.head(batch, self.kv, hidden[rows], project=False)
            logps, ids = self._scored(logits)
            for at, r in enumerate(now):
                tree = cast(DynamicTree, jobs[r].tree)
                src[r] = {}
                for i, node in enumerate(tree.frontier):
                    row = at * w + i
                    start = len(tree.tokens)
                    tree.add(node, ids[row], logps[row])
                    src[r].update(dict.fromkeys(range(start, len(tree.tokens)), row))
                jobs[r].seq.tokens.extend(tree.tokens[node] for node in tree.frontier)
                tree.advance()
        for j in jobs:
            assert len(j.seq.tokens) == len(j.seq.slots)

    def _scored(self, logits: torch.Tensor) -> tuple[list[list[float]], list[list[int]]]:
        """The top-w candidates of each row as target ids, with their log probabilities over
        the draft vocabulary (read back)."""
        top = torch.log_softmax(logits.float(), dim=-1).topk(self.expand, dim=-1)
        ids = self.head.target_ids(top.indices)
        return top.values.tolist(), ids.tolist()

    def _draft_step(
        self, batch: ForwardBatch, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A one-token draft step fed the head's own states: through the graphs when they
        serve it (the states in and out through HeadStep's buffers), else eagerly."""
        if self.graphs is not None and self.graphs.can_run(batch, self.kv):
            n = batch.batch_size
            self.step.hidden_in[:n].copy_(hidden)
            logits = self.graphs.maybe_run(batch, self.kv)
            assert logits is not None  # can_run said so
            return logits, self.step.hidden_out[:n]
        return self.head(batch, self.kv, hidden, project=False)

    def _top(self, logits: torch.Tensor) -> torch.Tensor:
        """The top-w candidates of each row, as target ids [rows, w] (on the device)."""
        w = min(self.tree_width, logits.shape[-1])
        return self.head.target_ids(logits.topk(w, dim=-1).indices)

    def _pack(self, jobs: list[_Job], active: list[int]) -> Packer:
        """The call's integers: the extend of each job's `feed` features (token index first
        + i is fed with token first + i + 1, into draft column exact + i), the table entries
        of every reserved slot, and per draft step s >= 1 each active job's draft s at token
        index n - 2 + s (column exact' - 1 + s, exact' = exact + feed)."""
        pk = Packer()
        ext = [j.feed for j in jobs]
        starts = np.cumsum([0, *ext[:-1]]).tolist()
        ids: list[int] = []
        pos: list[int] = []
        loc: list[int] = []
        for j in jobs:
            st, tokens = j.state, j.inp.token_ids
            first = st.next_index  # token index of the first fed feature
            ids += [int(tokens[first + 1 + i]) for i in range(j.feed)]
            pos += [first + i for i in range(j.feed)]
            loc += j.seq.slots[st.exact : st.exact + j.feed]
        pk.add("ids", ids)
        pk.add("pos", pos)
        pk.add("loc", loc)
        pk.add("rows", [j.seq.row for j in jobs])
        pk.add("lens", [j.state.exact + j.feed for j in jobs])
        pk.add("ext", ext)
        pk.add("start", starts)
        pk.add("last", [s + e - 1 for s, e in zip(starts, ext)])
        # the draft table: column c of a job's row holds the slot of its c-th draft entry
        pk.add("t_rows", [j.seq.row for j in jobs for _ in j.seq.slots[j.state.exact :]])
        pk.add("t_cols", [c for j in jobs for c in range(j.state.exact, len(j.seq.slots))])
        pk.add("t_vals", [x for j in jobs for x in j.seq.slots[j.state.exact :]])
        for s in range(1, len(active)):
            now = jobs[: active[s]]
            cols = [j.state.exact + j.feed - 1 + s for j in now]
            pk.add(f"pos{s}", [len(j.inp.token_ids) - 2 + s for j in now])
            pk.add(f"loc{s}", [j.seq.slots[c] for j, c in zip(now, cols)])
            pk.add(f"lens{s}", [c + 1 for c in cols])
        return pk


class HeadStep(nn.Module):
    """The EAGLE head's one-token draft step as the decode graphs run a model
    (`step(batch, kv, plan)` -> logits): fed the head's own states from a static buffer
    (hidden_in, rows as the batch's) and writing its output states to another (hidden_out),
    so that a captured graph reads and writes them at fixed addresses."""

    def __init__(self, head: EagleHead, rows: int) -> None:
        super().__init__()
        self.head = head
        param = next(head.parameters())
        shape = (rows, head.config.layer.hidden_size)
        self.hidden_in = torch.zeros(shape, dtype=param.dtype, device=param.device)
        self.hidden_out = torch.zeros(shape, dtype=param.dtype, device=param.device)

    @property
    def attention(self) -> Any:  # what the decode graphs plan with
        return self.head.attention

    def forward(self, batch: ForwardBatch, kv: KVPool, plan: Any = None) -> torch.Tensor:
        n = batch.batch_size
        logits, hidden = self.head(batch, kv, self.hidden_in[:n], project=False, plan=plan)
        self.hidden_out[:n].copy_(hidden)
        return logits
