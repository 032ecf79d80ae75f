"""Req: one generation request as the scheduler tracks it. Imports nothing heavy.

Its tokens and how far their KV is computed, as row positions of the request-to-token table:
[0, cache_len) in the radix tree, [cache_len, num_allocated) its own slots, [num_computed,
seq_len) still to feed. A negative token id is an overlap-scheduling placeholder; attention
sinks delete evicted tokens; `prefix_key` keeps LoRA adapters' prefixes apart. Plain data:
the scheduler mutates it, the engine reads it. Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterator, MutableSequence, Sequence
from typing import Any

from lmprog.core.protocol import FinishReason
from lmprog.core.sampling import SamplingParams

LORA_KEY_SHIFT = 40  # token ids are far below 2**40: adapter uid u keys from u * 2**40


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no KV and no row
    RUNNING = "running"  # holds a row, a lock on its cached prefix and its own slots
    RETRACTED = "retracted"  # was running, gave back its KV when the pool ran out; queued
    FINISHED = "finished"  # done (see finish_reason); holds nothing


class Req:
    """One request. Construct it, then hand it to `Scheduler.submit`.

    rid: hashable, unique among unfinished requests; prompt_ids: at least one token id;
    prompt_logprob_start: logits wanted for every fed position from here on (the cache match
    stops there; after a retraction keep the last value per position); engine_data: opaque
    engine state; lora_id: its LoRA adapter's uid (0: none); images: its images'
    runtime.images.ImageRun, in order, whose positions in prompt_ids hold the image's key.
    """

    __slots__ = (
        "rid",
        "token_ids",
        "prompt_len",
        "params",
        "status",
        "arrival",
        "cache_len",
        "num_computed",
        "num_allocated",
        "extend_len",
        "row",
        "last_node",
        "finish_reason",
        "cached_tokens",
        "cached_host_tokens",
        "cached_disk_tokens",
        "max_seq_len",
        "stop_len",
        "draft_ids",
        "draft_parents",
        "row_dirty",
        "prompt_logprob_start",
        "engine_data",
        "num_retractions",
        "num_evicted",
        "prompt_end",
        "lora_id",
        "evicted_output_ids",
        "rewritten_from",
        "images",
    )

    def __init__(
        self,
        rid: Hashable,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        prompt_logprob_start: int | None = None,
        engine_data: Any = None,
        lora_id: int = 0,
        images: Sequence[Any] = (),
    ) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt_ids, (str, bytes)) or len(prompt_ids) == 0:
            raise ValueError("prompt_ids must be a non-empty sequence of token ids")
        self.rid = rid
        self.token_ids: list[int] = [int(t) for t in prompt_ids]
        self.prompt_len = len(self.token_ids)
        self.params = params
        self.status = ReqStatus.WAITING
        self.arrival = -1  # submission order, set by the scheduler; retraction keeps it
        self.cache_len = 0
        self.num_computed = 0
        self.num_allocated = 0
        self.extend_len = 0  # tokens fed in the step in flight (0 when not scheduled)
        self.row: int | None = None
        self.last_node: Any = None  # radix node locked for [0, cache_len); None when idle
        self.finish_reason: FinishReason | None = None
        self.cached_tokens = 0  # prefix hit at the first admission (GenerateResult)
        self.cached_host_tokens = 0  # of those, loaded from the host tier (disk included)
        self.cached_disk_tokens = 0  # of those, read from the disk tier
        self.max_seq_len = 0  # set at submission: min(context length, KV pool); with
        # attention sinks sys.maxsize (no cap: evictions keep the KV within the window)
        self.stop_len = self.prompt_len + params.max_tokens  # seq_len that ends it ("length");
        # submission caps it at max_seq_len, an eviction lowers it by the tokens it deletes
        self.draft_ids: list[int] = []  # speculative tokens to verify in the next step
        # None: draft_ids is a chain; else a token tree (runtime/draft_tree.py): parents[i] is
        # draft i's parent, -1 for the root. Cleared with draft_ids.
        self.draft_parents: tuple[int, ...] | None = None
        self.row_dirty = False  # row [0, num_computed) changed since last scheduled
        self.prompt_logprob_start = prompt_logprob_start
        self.engine_data = engine_data
        self.num_retractions = 0
        self.num_evicted = (
            0  # tokens evicted after the attention sinks (docs/design/attention-sinks.md)
        )
        self.prompt_end = self.prompt_len  # where the outputs start in token_ids
        self.evicted_output_ids: list[int] = []  # outputs the attention sinks evicted
        # tokens from this index were rewritten by the decoding side this step (a
        # jump-forward's retokenization): their KV, if any, is stale (Scheduler.process_results)
        self.rewritten_from: int | None = None
        if isinstance(lora_id, bool) or not isinstance(lora_id, int) or lora_id < 0:
            raise ValueError(f"lora_id must be an int >= 0, got {lora_id!r}")
        self.lora_id = lora_id
        self.images: tuple[Any, ...] = tuple(images)

    # -- derived lengths -------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return len(self.token_ids)

    @property
    def output_len(self) -> int:
        """Tokens generated so far (evicted ones included)."""
        return len(self.token_ids) + self.num_evicted - self.prompt_len

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt tokens still in token_ids (all of them unless evicted)."""
        return self.token_ids[: self.prompt_end]

    @property
    def output_ids(self) -> list[int]:
        """The generated tokens still in token_ids (all of them unless evicted)."""
        return self.token_ids[self.prompt_end :]

    @property
    def num_placeholders(self) -> int:
        """Overlap scheduling's placeholders at the end of token_ids (at most two)."""
        ids, n = self.token_ids, 0
        while n < len(ids) and ids[-1 - n] < 0:
            n += 1
        return n

    @property
    def known_len(self) -> int:
        """seq_len without the placeholders: the tokens the host knows."""
        return len(self.token_ids) - self.num_placeholders

    @property
    def pending_len(self) -> int:
        """Known tokens whose KV is not computed yet (1 for a plain decode)."""
        return len(self.token_ids) - self.num_computed

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still generate under max_tokens and its length cap."""
        return max(0, self.stop_len - len(self.token_ids))

    def prefix_key(self, end: int) -> list[int]:
        """token_ids[:end] as the prefix cache keys them: under an adapter, the first token
        offset into that adapter's key space (ids stay non-negative), so no prefix is
        shared across adapters. A fresh list (the cache may keep it)."""
        key = self.token_ids[:end]
        if self.lora_id and key and key[0] >= 0:
            key[0] += self.lora_id << LORA_KEY_SHIFT
        return key

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Req(rid={self.rid!r}, {self.status.value}, prompt={self.prompt_len}, "
            f"out={self.output_len}, cached={self.cache_len}, computed={self.num_computed}, "
            f"allocated={self.num_allocated}, row={self.row})"
        )


class ReqOutputs(MutableSequence[int]):
    """A request's generated tokens as its DecodeState reads and writes them, kept in the one
    list that holds them, `req.token_ids` (after `prompt_end`; outputs the attention sinks
    evicted come first, from `evicted_output_ids`). Placeholders are not outputs yet: an
    append fills the oldest one. Rewriting outputs (a jump-forward) marks
    `req.rewritten_from`, so the scheduler drops the KV computed for the old tokens."""

    __slots__ = ("req",)

    def __init__(self, req: Req) -> None:
        self.req = req

    def __len__(self) -> int:
        return self.req.output_len - self.req.num_placeholders

    def append(self, token: int) -> None:
        req = self.req
        placeholders = req.num_placeholders
        if placeholders:
            req.token_ids[len(req.token_ids) - placeholders] = token
        else:
            req.token_ids.append(token)

    def _kept(self) -> list[int]:
        req = self.req
        return req.token_ids[req.prompt_end : req.known_len]

    def __getitem__(self, index: Any) -> Any:
        return (self.req.evicted_output_ids + self._kept())[index]

    def __iter__(self) -> Iterator[int]:
        yield from self.req.evicted_output_ids
        yield from self._kept()

    def __setitem__(self, index: Any, value: Any) -> None:
        """Only `outputs[kept:] = new_ids` (a jump-forward's rewritten tail)."""
        req = self.req
        if not isinstance(index, slice) or index.stop is not None or index.step is not None:
            raise TypeError("a request's outputs are rewritten as outputs[kept:] = new_ids")
        start = req.prompt_end + index.start - len(req.evicted_output_ids)
        if not req.prompt_end <= start <= len(req.token_ids) or req.num_placeholders:
            raise ValueError(f"{req}: cannot rewrite its outputs from {index.start}")
        req.token_ids[start:] = [int(t) for t in value]
        if req.rewritten_from is None or start < req.rewritten_from:
            req.rewritten_from = start

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ReqOutputs, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"ReqOutputs({list(self)!r})"

    def __delitem__(self, index: Any) -> None:
        raise TypeError("a request's outputs are rewritten as outputs[kept:] = new_ids")

    def insert(self, index: int, value: int) -> None:
        raise TypeError("a request's outputs grow by append")
