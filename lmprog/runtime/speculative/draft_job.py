"""One propose() call of the draft proposer: its jobs, one per request. The integers of its
steps are packed for one host-to-device copy, and each draft token is chosen here.

    one job (n = len(tokens), c = keep, k drafts), by position in the request's draft row:
        | kept 0..c-1 | extend c..n-1 | fed drafts d1..d_{k-1}: n..n+k-2 |    dk is not fed
    seq.slots[c:] were reserved for positions c..n+k-2 before the call's first forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lmprog.core.sampling import SamplingParams
from lmprog.decoding.sampler import SamplingTensors, draw, probabilities

from ..executor.forward_batch import ForwardBatch
from .draft_cache import DraftSeq
from .proposer import Proposal


@dataclass(eq=False)
class DraftJob:
    """One request's share of a propose() call."""

    seq: DraftSeq
    tokens: list[int]  # the request's whole sequence
    keep: int  # draft KV kept from before
    k: int  # drafts to produce
    params: SamplingParams | None
    drafts: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)  # one row per draft when sampled

    @property
    def sampled(self) -> bool:
        return self.params is not None and not self.params.greedy

    def proposal(self) -> Proposal:
        return Proposal(tuple(self.drafts), torch.stack(self.probs) if self.sampled else None)


class DraftSampler:
    """Picks one draft per row of a step: the argmax, or for sampled requests a draw from
    the draft's distribution (the decoding sampler's `probabilities`), whose row is appended to the
    job's probs. A step
    serves a prefix of the (k-sorted) jobs, so its sampled rows are a prefix of all sampled
    rows: their sampling tensors are built once per prefix length, not once per step."""

    def __init__(self, jobs: list[DraftJob], device: torch.device) -> None:
        self.jobs, self.device = jobs, device
        self.sampled = [i for i, j in enumerate(jobs) if j.sampled]
        self._built: dict[int, tuple[torch.Tensor, SamplingTensors, list[Any]]] = {}

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        ids = logits.argmax(dim=-1)
        m = sum(i < logits.shape[0] for i in self.sampled)
        if m == 0:
            return ids
        rows, tensors, generators = self._rows(m)
        probs = probabilities(logits.index_select(0, rows), tensors)
        ids[rows] = draw(probs, generators)
        for i, row in zip(self.sampled[:m], probs.unbind(0)):
            self.jobs[i].probs.append(row)
        return ids

    def _rows(self, m: int) -> tuple[torch.Tensor, SamplingTensors, list[Any]]:
        if m not in self._built:
            idx = self.sampled[:m]
            self._built[m] = (
                torch.tensor(idx, dtype=torch.int64, device=self.device),
                SamplingTensors.from_params(
                    [_draft_params(self.jobs[i].params) for i in idx], device=self.device
                ),
                [self.jobs[i].seq.generator for i in idx],
            )
        return self._built[m]


def _draft_params(params: SamplingParams | None) -> SamplingParams:
    """The transforms the draft applies: temperature, top-k/p and min-p. Penalties need
    counts the draft does not keep (`probabilities` skips them without), and the min_tokens
    ban is left to the target (no device sync for it here). For a sampled job (params set)."""
    assert params is not None, "a sampled draft job has params"
    return params.merged({"min_tokens": 0}) if params.min_tokens else params


class Packer:
    """Named host int lists, sent to the device as one int64 buffer (one copy)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.parts: list[list[int]] = []

    def add(self, name: str, values: list[int]) -> None:
        self.names.append(name)
        self.parts.append(values)

    def send(self, device: torch.device) -> dict[str, torch.Tensor]:
        flat = np.fromiter((x for part in self.parts for x in part), dtype=np.int64)
        dev = torch.from_numpy(flat).to(device)
        return dict(zip(self.names, dev.split([len(p) for p in self.parts])))


def catch_up_members(jobs: list[DraftJob], steps: int, i: int) -> list[int]:
    """The jobs (indices) that feed a token in catch-up step i of `steps`: new tokens are
    fed one per step, right-aligned so every job feeds its last one in the final step."""
    return [r for r, j in enumerate(jobs) if len(j.tokens) - j.keep >= steps - i]


def pack_steps(jobs: list[DraftJob], active: list[int], catch_up: int = 0) -> Packer:
    """Every integer of the extend (or, catch_up > 0, of that many one-token catch-up
    steps) and of the decode steps (see draft.py's positions, docs/design/speculative.md)."""
    pk = Packer()
    for i in range(catch_up):
        now = [jobs[r] for r in catch_up_members(jobs, catch_up, i)]
        at = [len(j.tokens) - catch_up + i for j in now]  # the position each one feeds
        pk.add(f"cids{i}", [j.tokens[p] for j, p in zip(now, at)])
        pk.add(f"cpos{i}", at)
        pk.add(f"cloc{i}", [j.seq.slots[p] for j, p in zip(now, at)])
        pk.add(f"crows{i}", [j.seq.row for j in now])
        pk.add(f"clens{i}", [p + 1 for p in at])
    ext = [len(j.tokens) - j.keep for j in jobs]
    starts = np.cumsum([0, *ext[:-1]]).tolist()
    pk.add("ids", [t for j in jobs for t in j.tokens[j.keep :]])
    pk.add("pos", [p for j in jobs for p in range(j.keep, len(j.tokens))])
    pk.add("loc", [x for j in jobs for x in j.seq.slots[j.keep : len(j.tokens)]])
    pk.add("rows", [j.seq.row for j in jobs])
    pk.add("lens", [len(j.tokens) for j in jobs])
    pk.add("ext", ext)
    pk.add("start", starts)
    pk.add("last", [s + e - 1 for s, e in zip(starts, ext)])
    pk.add("t_rows", [j.seq.row for j in jobs for _ in j.seq.slots[j.keep :]])
    pk.add("t_cols", [p for j in jobs for p in range(j.keep, len(j.seq.slots))])
    pk.add("t_vals", [x for j in jobs for x in j.seq.slots[j.keep :]])
    for s in range(1, len(active)):
        now = jobs[: active[s]]
        pk.add(f"pos{s}", [len(j.tokens) + s - 1 for j in now])
        pk.add(f"loc{s}", [j.seq.slots[len(j.tokens) + s - 1] for j in now])
        pk.add(f"lens{s}", [len(j.tokens) + s for j in now])
    return pk


class DraftTable:
    """A drafter's page table (request row -> KV slots) and the constant index rows its
    batches slice, with the two batch shapes a drafting call runs: the extend of the new
    tokens from a call's packed integers (`pack_steps`' names), and one token per request."""

    def __init__(self, max_requests: int, context_length: int, device: torch.device) -> None:
        self.req_to_token = torch.zeros(
            (max_requests, context_length), dtype=torch.int32, device=device
        )
        self.ones = torch.ones(max_requests, dtype=torch.int64, device=device)
        self.arange = torch.arange(max_requests, dtype=torch.int64, device=device)

    def extend_batch(
        self, ints: dict[str, torch.Tensor], seq_lens: tuple[int, ...], extend_lens: tuple[int, ...]
    ) -> ForwardBatch:
        return ForwardBatch(
            input_ids=ints["ids"],
            positions=ints["pos"],
            out_cache_loc=ints["loc"],
            req_pool_indices=ints["rows"],
            seq_lens=ints["lens"],
            extend_lens=ints["ext"],
            extend_start_loc=ints["start"],
            req_to_token=self.req_to_token,
            logits_indices=ints["last"],
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=extend_lens,
        )

    def one_token_batch(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        loc: torch.Tensor,
        rows: torch.Tensor,
        lens: torch.Tensor,
        host_lens: list[int],
    ) -> ForwardBatch:
        return ForwardBatch.one_token_each(
            (ids, pos, loc, rows, lens),
            self.ones,
            self.arange,
            self.req_to_token,
            seq_lens_cpu=tuple(host_lens),
        )
