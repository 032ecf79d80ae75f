"""Speculator: the engine's side of speculative decoding (engine thread only).

    chosen = speculator.choose(scheduler.decoding())   # who drafts, how far (no token read)
    speculator.propose(chosen)                  # req.draft_ids (after the engine settles)
    batch = scheduler.schedule()                # verify entries: pending token(s) + drafts
    speculator.on_step(batch, result)           # acceptance statistics
    speculator.release(rid)                     # a request ended or was retracted

Draft lengths, guide cuts, cost measurement, drafts after jump-forward:
docs/design/speculative.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from lmprog.fsm.mask import allowed_bitmask, unpack_bitmask

from ..draft_tree import ROOT, is_chain, prune
from ..models.llama import HiddenCapture
from ..request import Req, ReqStatus
from .adaptive import AcceptanceRate, DraftLengths, ProposeCost
from .config import SpeculativeConfig
from .head_proposer import HeadProposer, spine
from .proposer import Proposal, ProposalInput, Proposer

log = logging.getLogger(__name__)


class Speculator:
    """Drives `proposer` for an engine whose model has `vocab_size` tokens on `device`."""

    def __init__(
        self,
        proposer: Proposer,
        config: SpeculativeConfig,
        *,
        vocab_size: int,
        device: torch.device | str = "cpu",
        name: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        trees: bool = True,
    ) -> None:
        """name: what stats() reports as "speculative" (default: config.method); clock:
        seconds, for measuring the proposing cost (tests pass their own); trees: verify token
        trees (False: a tree's first branch is verified as a chain)."""
        if not isinstance(proposer, Proposer):
            raise TypeError(f"proposer must be a Proposer, got {type(proposer).__name__}")
        self.proposer, self.config = proposer, config
        self.name = name or config.method
        self.device = torch.device(device)
        self.vocab_size = vocab_size
        self.trees = trees
        self.verify_cost, step_tokens = config.resolved_for(self.device.type)
        self.lengths = DraftLengths(
            config.num_tokens, self.verify_cost, step_tokens, config.adaptive
        )
        # draft_cost=None: verify cost + measured proposing cost; a number: that alone
        measure = config.adaptive and config.draft_cost is None
        self.propose_cost = ProposeCost() if measure else None
        self.lengths.cost_known = not measure
        self._clock = clock
        self._timing: tuple[float, float, int] | None = None  # see _measure
        self.enabled = True
        # keyed (rid, after a jump-forward): drafts that start a free span right after
        # forced text fare differently from drafts inside a span (docs/design/speculative.md)
        self._rates: dict[tuple[Hashable, bool], AcceptanceRate] = {}
        # every request's verifies, pooled: the prior of a request's own rate
        self._pools = {False: AcceptanceRate(), True: AcceptanceRate()}
        self._probs: dict[Hashable, torch.Tensor] = {}
        self.proposed = 0  # draft tokens handed to the scheduler
        self.verified = 0  # draft tokens fed to the model
        self.accepted = 0  # draft tokens accepted
        self.verify_entries = 0  # verify entries run
        self.rejections = 0  # chains cut by a rejected draft
        self.errors = 0  # propose() calls that raised (those steps ran without drafts)
        self.guide_cuts = 0  # proposals cut short because the constraint forbade a draft
        self.jump_verifies = 0  # verify entries whose drafts followed jump-forward tokens
        self.tree_verifies = 0  # verify entries whose drafts were a token tree

    # -- before schedule() -----------------------------------------------------------------
    def choose(self, decoding: Sequence[Req]) -> list[tuple[Req, int]]:
        """Which decoding requests (Scheduler.decoding: every running request whose pending
        tokens were generated: its last token, after a jump-forward also the forced ones)
        draft this step, and how far; every one's draft_ids cleared. Reads no token, so a
        step still in flight (overlap scheduling) can stay so when nobody drafts."""
        self._probs.clear()
        self._timing = None
        fed = 0  # tokens the decoding requests feed before any draft
        for req in decoding:
            req.draft_ids, req.draft_parents = [], None
            fed += req.pending_len
        if not self.enabled or not decoding or self.lengths.spare(fed) <= 0:
            return []
        candidates = [r for r in decoding if r.remaining_tokens >= 2 and not r.engine_data.done]
        ks = self.lengths.choose(
            [self._rate(r) for r in candidates], [r.remaining_tokens - 1 for r in candidates], fed
        )
        return [(r, k) for r, k in zip(candidates, ks) if k > 0]

    def propose(self, chosen: Sequence[tuple[Req, int]]) -> None:
        """Set the draft_ids of the requests `choose` picked, from their tokens (known by
        now: the engine settles the step in flight first); those that ended since are
        skipped."""
        step_start = self._clock()
        asked = [
            (r, min(k, r.remaining_tokens - 1))
            for r, k in chosen
            if r.status is not ReqStatus.FINISHED and not r.engine_data.done
        ]
        asked = [(r, k) for r, k in asked if k > 0]
        if not asked:
            return
        propose_start = self._clock()
        try:
            proposals = self.proposer.propose(
                [ProposalInput(r.rid, r.token_ids, k, r.params) for r, k in asked]
            )
            if len(proposals) != len(asked):
                raise RuntimeError(
                    f"{type(self.proposer).__name__}.propose returned "
                    f"{len(proposals)} proposals for {len(asked)} inputs"
                )
        except Exception:  # drafts are optional: this step decodes plainly
            log.exception("the speculative proposer failed; decoding without drafts")
            self.errors += 1
            return
        for (req, k), proposal in zip(asked, proposals):
            if proposal.parents is None:
                drafts, probs = self._cut(req, proposal, k)
                parents = None
            else:
                drafts, probs, parents = self._cut_tree(req, proposal, k)
            self._rate(req).proposed(empty=not drafts)
            req.draft_ids, req.draft_parents = drafts, parents
            self.proposed += len(drafts)
            if probs is not None and drafts:
                self._probs[req.rid] = probs
        self._timing = (step_start, self._clock() - propose_start, max(k for _, k in asked))

    # -- draft heads: the target's hidden states ------------------------------------------
    @property
    def capture(self) -> HiddenCapture | None:
        """The hidden states this step's forward must hand over (None: a plain forward):
        a draft head's, while speculation is on."""
        return self.head_capture if self.enabled else None

    @property
    def head_capture(self) -> HiddenCapture | None:
        """The hidden states the installed draft head reads, whether speculation is on or
        not (the CUDA graphs are built for them); None without a head."""
        if not isinstance(self.proposer, HeadProposer):
            return None
        return self.proposer.capture

    def observe(self, batch: Any, hidden: torch.Tensor) -> None:
        """Hand each request's rows of a captured step (LlamaForCausalLM.forward_capture) to
        the head proposer, by token index: every fed token's row (capture.layers), or the
        rows of the tokens that got logits (the final hidden state)."""
        proposer = self.proposer
        assert isinstance(proposer, HeadProposer)
        per_token = bool(proposer.capture.layers)
        at = 0  # next row of `hidden`
        for e in batch.entries:
            if per_token:
                first, count, row = e.start, e.num_new, e.offset
            elif e.logits_from is None:
                continue
            else:
                first = max(e.start, e.logits_from)
                count, row = max(0, e.end - first), at  # (a chunk before logits_from: 0)
                at += count
            if count <= 0:
                continue
            try:
                proposer.observe(e.req.rid, first, hidden[row : row + count])
            except Exception:  # drafts are optional: the request's head state starts over
                log.exception("the draft head's proposer failed to take hidden states")
                self.errors += 1
                proposer.release(e.req.rid)

    def _cut(self, req: Req, proposal: Proposal, k: int) -> tuple[list[int], Any]:
        """The verifiable prefix of a proposal: <= k ids inside the vocabulary that the
        request's guide allows; draft distributions restricted and renormalised to what each
        position's cut admits (a draft drawn from q but kept only when allowed was in effect
        drawn from q restricted to the allowed set: the rejection rule needs that q)."""
        drafts: list[int] = []
        guide = req.engine_data.guide
        cursor = guide.copy() if guide is not None else None
        wants_masks = proposal.probs is not None  # only a draft distribution is restricted
        guides: list[Any] = []  # the guide before each draft (its mask restricts q)
        for t in proposal.token_ids[:k]:
            t = int(t)
            if not 0 <= t < self.vocab_size:
                break
            if cursor is not None:
                if not cursor.is_allowed(t):
                    self.guide_cuts += 1
                    break
                if wants_masks:
                    guides.append(cursor.copy())
                cursor.advance(t)
            drafts.append(t)
        if proposal.probs is None or not drafts:
            return drafts, None
        return drafts, self._restricted(proposal.probs, list(range(len(drafts))), guides)

    def _cut_tree(
        self, req: Req, proposal: Proposal, k: int
    ) -> tuple[list[int], Any, tuple[int, ...] | None]:
        """_cut for a token tree: its first k nodes (a prefix in topological order is a tree)
        less every node outside the vocabulary or forbidden by the guide after its
        ancestors, with its subtree (the guide prunes branches as it cuts chains); with
        deterministic drafts also a sibling repeating an earlier sibling's token (never
        reached: the target's token follows the first). Returns (drafts, restricted draft
        distributions or None, parents; None when what is left is a chain)."""
        ids, parents = proposal.token_ids, proposal.parents
        assert parents is not None
        if not self.trees:  # verified as a chain: the path of each node's first child
            return *self._cut(req, spine(proposal), k), None
        guide = req.engine_data.guide
        wants_masks = proposal.probs is not None
        cursors: dict[int, Any] = {}  # node -> the guide after it (ROOT: before any draft)
        if guide is not None:
            cursors[ROOT] = guide.copy()
        seen: set[tuple[int, int]] = set()  # (parent, token) of the kept deterministic drafts
        keep = [False] * len(ids)
        guides: list[Any] = []  # the guide before each kept node (its mask restricts q)
        alive, count = {ROOT}, 0
        for i, (t, p) in enumerate(zip(ids, parents)):
            t = int(t)
            if p not in alive or not 0 <= t < self.vocab_size:
                continue
            if not wants_masks and (p, t) in seen:
                continue
            if guide is not None:
                cursor = cursors[p]
                if not cursor.is_allowed(t):
                    self.guide_cuts += 1
                    continue
                if wants_masks:
                    guides.append(cursor.copy())
                cursors[i] = cursor.copy()
                cursors[i].advance(t)
            seen.add((p, t))
            keep[i] = True
            alive.add(i)
            count += 1
            if count >= k:
                break
        kept, new_parents = prune(parents, keep)
        drafts = [int(ids[i]) for i in kept]
        probs = None
        if proposal.probs is not None and drafts:
            probs = self._restricted(proposal.probs, kept, guides)
        return drafts, probs, (None if is_chain(new_parents) else new_parents)

    def _restricted(self, probs: Any, rows: list[int], guides: list[Any]) -> torch.Tensor:
        n = len(rows)
        assert len(probs) > max(rows), "draft probs must be [len(token_ids), vocab]"
        picked = probs[:n] if rows == list(range(n)) else probs[rows]
        q = torch.as_tensor(picked, dtype=torch.float32).to(self.device)
        assert q.dim() == 2 and q.shape[0] == n, "draft probs must be [len(token_ids), vocab]"
        if q.shape[1] > self.vocab_size:
            q = q[:, : self.vocab_size]
        elif q.shape[1] < self.vocab_size:
            q = torch.nn.functional.pad(q, (0, self.vocab_size - q.shape[1]))
        if guides:
            q = q * unpack_bitmask(
                allowed_bitmask(guides, self.vocab_size, q.device), self.vocab_size
            )
        return q / q.sum(dim=-1, keepdim=True).clamp_min(1e-30)

    # -- during and after the step ---------------------------------------------------------
    def draft_probs(self, req: Req) -> torch.Tensor | None:
        """The draft distributions of req's drafts this step (None: deterministic drafts)."""
        return self._probs.get(req.rid)

    def on_step(self, batch: Any, result: Any) -> None:
        """Record the acceptance of the step's verify entries (StepResult from StepOutputs)."""
        for i, e in enumerate(batch.entries):
            if not e.sample or not e.draft_ids:
                continue
            after_jump = e.num_new > e.num_draft + 1
            rate = self._rates.get((e.req.rid, after_jump))
            accepted, rejected = result.accepted[i], result.rejected[i]
            self.verify_entries += 1
            self.jump_verifies += after_jump
            self.verified += e.num_draft
            self.tree_verifies += e.draft_parents is not None
            self.accepted += accepted
            self.rejections += rejected
            if rate is not None:
                rate.update(accepted, rejected)
            self._pools[after_jump].update(accepted, rejected)
        self._probs.clear()
        self._measure()

    def _measure(self) -> None:
        """Fold the step's proposing time into the draft lengths' cost. _timing: (when
        propose() began, seconds from the proposer's call to propose()'s end, the longest
        chain asked), set when this step's propose() asked the proposer."""
        timing, self._timing = self._timing, None
        if timing is None or self.propose_cost is None:
            return
        step_start, propose_s, longest = timing
        self.propose_cost.observe(propose_s, self._clock() - step_start, longest)
        self.lengths.cost = self.verify_cost + self.propose_cost.value
        self.lengths.cost_known = self.propose_cost.samples > 0

    def release(self, rid: Hashable, finished: bool = True) -> None:
        """Forget the proposer's state of rid (and, when it finished, its statistics)."""
        self._probs.pop(rid, None)
        if finished:
            self._rates.pop((rid, False), None)
            self._rates.pop((rid, True), None)
        self.proposer.release(rid)

    def set_proposer(self, proposer: Proposer, name: str | None = None) -> None:
        """Draft with `proposer` from the next step (engine thread: Engine.call), e.g. to
        compare chains and trees in one run; acceptance statistics start over."""
        if not isinstance(proposer, Proposer):
            raise TypeError(f"proposer must be a Proposer, got {type(proposer).__name__}")
        for rid, _ in list(self._rates):
            self.proposer.release(rid)
        self.proposer, self.name = proposer, name or self.name
        self._rates.clear()
        self._pools = {False: AcceptanceRate(), True: AcceptanceRate()}
        self._probs.clear()

    def _rate(self, req: Req) -> AcceptanceRate:
        key = (req.rid, req.pending_len > 1)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = AcceptanceRate(self._pools[key[1]])
        return rate

    def stats(self) -> dict[str, Any]:
        verified = self.verified
        out = {
            "speculative": self.name if self.enabled else None,
            "spec_draft_tokens": self.proposed,
            "spec_verified_tokens": verified,
            "spec_accepted_tokens": self.accepted,
            "spec_acceptance_rate": self.accepted / verified if verified else 0.0,
            "spec_verify_steps": self.verify_entries,
            "spec_guide_cuts": self.guide_cuts,
            "spec_draft_cost": self.lengths.cost,
            "spec_jump_verifies": self.jump_verifies,
            "spec_tree_verifies": self.tree_verifies,
            "spec_tokens_per_verify": (
                (self.accepted + self.verify_entries) / self.verify_entries
                if self.verify_entries
                else 0.0
            ),
        }
        extra = getattr(self.proposer, "stats", None)
        if callable(extra):
            out.update(extra())
        return out
