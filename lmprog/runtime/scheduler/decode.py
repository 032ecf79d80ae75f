"""Decode policy: every running request whose only pending token is its last sampled one
feeds that token (and, when speculating, its draft tokens to verify)."""

from __future__ import annotations

from collections.abc import Iterable

from ..config import SchedulerConfig
from ..request import Req
from .budget import StepBudget
from .plan import StepPlan
from .requests import RequestTable


class DecodePolicy:
    def verifiable(self, requests: RequestTable, config: SchedulerConfig) -> list[Req]:
        """Scheduler.decoding: the contract is documented there."""
        running = requests.running.values()
        if not config.hybrid_batching and (
            requests.waiting or any(r.pending_len > 1 for r in running)
        ):
            return []
        budget = config.max_num_batched_tokens
        return [
            r
            for r in running
            if r.num_computed == len(r.token_ids) - 1
            or (r.num_computed >= r.prompt_end and len(r.token_ids) - r.num_computed < budget)
        ]

    def split(self, running: Iterable[Req]) -> tuple[list[Req], list[Req]]:
        """(decoders: exactly one pending token, extenders: several pending, oldest first)."""
        decoders, extenders = [], []
        for req in running:
            if len(req.token_ids) - req.num_computed == 1:
                decoders.append(req)
            else:
                extenders.append(req)
        if len(extenders) > 1:
            extenders.sort(key=lambda r: r.arrival)
        return decoders, extenders

    def slots_needed(self, decoders: list[Req], page_size: int) -> int:
        """KV slots the decoders' single tokens need (drafts not counted)."""
        if page_size == 1:
            return len(decoders)
        return sum(page_size for r in decoders if r.num_computed == r.num_allocated)

    def plan(self, decoders: list[Req], plan: StepPlan, budget: StepBudget, page_size: int) -> None:
        """Plan one token per decoder, then verify tokens from what budget and memory leave.
        Memory for the single tokens must already be ensured (the scheduler retracts first)
        and is reserved before any draft is considered."""
        budget.take(len(decoders))
        plan.reserve(self.slots_needed(decoders, page_size))
        plain = []
        for req in decoders:
            if req.draft_ids and budget.tokens:
                self._plan_verify(req, plan, budget, page_size)
            else:
                plain.append(req)
        plan.add_decodes(plain)

    def _plan_verify(self, req: Req, plan: StepPlan, budget: StepBudget, page_size: int) -> None:
        own = page_size if req.num_computed == req.num_allocated else 0  # reserved for it
        drafts = plan.fitting_drafts(req, 1, budget.tokens, extra_room=own)
        budget.take(len(drafts))
        slots = plan.cache.tokens_to_extend(req, req.num_computed + 1 + len(drafts))
        plan.add(req, 1 + len(drafts), drafts, slots - own, plan.draft_parents(req, len(drafts)))
