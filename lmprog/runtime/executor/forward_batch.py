"""ForwardBatch: what one model step computes, as plain tensors on the model's device.

Request r brings extend_lens[r] new tokens (input_ids / positions / out_cache_loc, in
request order) after a cached prefix; req_to_token[req_pool_indices[r], :seq_lens[r]]
holds the slots of all its tokens. A new token attends causally over its request's tokens
unless `custom_mask` says otherwise (for every request, or with `mask_indptr` for those whose
offset is >= 0: token-tree verifies). Layout: docs/design/scheduling.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

IntsLike = Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    out_cache_loc: torch.Tensor  # int64 [T], slots in [1, num_slots]
    req_pool_indices: torch.Tensor  # int64 [B], rows of req_to_token
    seq_lens: torch.Tensor  # int64 [B], prefix + new tokens
    extend_lens: torch.Tensor  # int64 [B], new tokens (>= 1)
    extend_start_loc: torch.Tensor  # int64 [B], exclusive prefix sums of extend_lens
    req_to_token: torch.Tensor  # int32 [max_running_requests, max_context_len]
    logits_indices: torch.Tensor  # int64 [R], rows of the T tokens that get logits
    custom_mask: torch.Tensor | None = None  # bool, flat; None = causal
    # int64 [B]: where request r's [extend_len, seq_len] block starts in custom_mask, -1 for a
    # causal request; None: every request has a block, packed in order
    mask_indptr: torch.Tensor | None = None
    # The same lengths as host ints, when the caller has them: lets backends plan without a
    # device sync (build() fills them).
    seq_lens_cpu: tuple[int, ...] | None = None
    extend_lens_cpu: tuple[int, ...] | None = None
    # A vision-language model's image embeddings for this step: row image_rows[i] of the T
    # tokens (an image position, whose input id is the image's cache key) takes
    # image_embeds[i] in place of a token embedding. None: no image position is fed.
    image_rows: torch.Tensor | None = None  # int64 [K]
    image_embeds: torch.Tensor | None = None  # [K, hidden]
    mask_indptr_cpu: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        t, b = self.input_ids.shape[0], self.req_pool_indices.shape[0]
        assert self.positions.shape == (t,) and self.out_cache_loc.shape == (t,)
        assert self.seq_lens.shape == self.extend_lens.shape == self.extend_start_loc.shape == (b,)
        assert self.req_to_token.dim() == 2 and self.logits_indices.dim() == 1
        assert b <= t, "every request brings at least one new token"
        assert self.seq_lens_cpu is None or len(self.seq_lens_cpu) == b
        assert self.extend_lens_cpu is None or len(self.extend_lens_cpu) == b
        assert (self.image_rows is None) == (self.image_embeds is None)
        assert self.mask_indptr is None or (
            self.custom_mask is not None and self.mask_indptr.shape == (b,)
        )

    @classmethod
    def one_token_each(
        cls,
        ints: tuple[torch.Tensor, ...],
        ones: torch.Tensor,
        arange: torch.Tensor,
        req_to_token: torch.Tensor,
        seq_lens_cpu: tuple[int, ...] | None = None,
    ) -> ForwardBatch:
        """A batch of one token per sequence over static buffers: ints = (input_ids,
        positions, out_cache_loc, req_pool_indices, seq_lens) of b rows; ones and arange
        (int64, at least b long) give the extend lengths, starts and logits indices."""
        ids, pos, loc, rows, lens = ints
        b = len(ids)
        return cls(
            input_ids=ids,
            positions=pos,
            out_cache_loc=loc,
            req_pool_indices=rows,
            seq_lens=lens,
            extend_lens=ones[:b],
            extend_start_loc=arange[:b],
            req_to_token=req_to_token,
            logits_indices=arange[:b],
            seq_lens_cpu=seq_lens_cpu,
            extend_lens_cpu=(1,) * b,
        )

    @property
    def batch_size(self) -> int:
        return self.req_pool_indices.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def is_decode_only(self) -> bool:
        """One new token per request (so no causal structure among the new tokens)."""
        return self.num_tokens == self.batch_size and self.custom_mask is None

    def mask_offsets(self) -> list[int] | None:
        """Per request, where its custom_mask block starts (-1: causal); None: no mask.
        Reads the device only without the host copy."""
        if self.custom_mask is None:
            return None
        if self.mask_indptr is None:
            seq, ext = self.host_lens()
            sizes = [n * s for n, s in zip(ext, seq)]
            return [sum(sizes[:i]) for i in range(len(sizes))]
        if self.mask_indptr_cpu is not None:
            return list(self.mask_indptr_cpu)
        return [int(x) for x in self.mask_indptr.tolist()]

    def host_lens(self) -> tuple[list[int], list[int]]:
        """(seq_lens, extend_lens) as Python ints; reads the device only without the cpu copies."""
        seq = list(self.seq_lens_cpu) if self.seq_lens_cpu is not None else self.seq_lens.tolist()
        ext = (
            list(self.extend_lens_cpu)
            if self.extend_lens_cpu is not None
            else self.extend_lens.tolist()
        )
        return seq, ext

    @classmethod
    def build(
        cls,
        *,
        input_ids: IntsLike,
        out_cache_loc: IntsLike,
        req_pool_indices: IntsLike,
        seq_lens: IntsLike,
        extend_lens: IntsLike,
        req_to_token: torch.Tensor,
        positions: IntsLike | None = None,
        logits_indices: IntsLike | None = None,
        custom_mask: torch.Tensor | None = None,
        mask_indptr: IntsLike | None = None,
        device: torch.device | str | None = None,
    ) -> ForwardBatch:
        """Validate host-side lists (or tensors) and build the batch on `device`.

        positions default to prefix_len .. seq_len - 1 per request; logits_indices default to
        the last new token of each request.
        """
        ext = _ints(extend_lens, "extend_lens")
        lens = _ints(seq_lens, "seq_lens")
        rows = _ints(req_pool_indices, "req_pool_indices")
        ids = _ints(input_ids, "input_ids")
        _check_lengths(ext, lens, rows, len(ids), req_to_token)
        starts = [sum(ext[:i]) for i in range(len(ext))]
        if positions is None:
            positions = [p for n, s in zip(ext, lens) for p in range(s - n, s)]
        if logits_indices is None:
            logits_indices = [s + n - 1 for s, n in zip(starts, ext)]
        pos, loc = _ints(positions, "positions"), _ints(out_cache_loc, "out_cache_loc")
        logit_rows = _ints(logits_indices, "logits_indices")
        if len(pos) != len(ids) or len(loc) != len(ids):
            raise ValueError(
                f"positions ({len(pos)}) and out_cache_loc ({len(loc)}) need one "
                f"entry per input id ({len(ids)})"
            )
        if any(not 0 <= i < len(ids) for i in logit_rows):
            raise ValueError(f"logits_indices must lie in [0, {len(ids)})")
        indptr = None if mask_indptr is None else _ints(mask_indptr, "mask_indptr")
        if indptr is not None:
            if custom_mask is None or len(indptr) != len(ext):
                raise ValueError("mask_indptr needs custom_mask and one offset per request")
            for off, n, s in zip(indptr, ext, lens):
                if off >= 0 and off + n * s > custom_mask.numel():
                    raise ValueError(f"mask block at {off} of {n}x{s} runs past custom_mask")
        elif custom_mask is not None and custom_mask.numel() != sum(
            n * s for n, s in zip(ext, lens)
        ):
            raise ValueError("custom_mask needs sum(extend_len * seq_len) entries")
        dev = torch.device(device) if device is not None else req_to_token.device

        def t(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.int64, device=dev)

        return cls(
            t(ids),
            t(pos),
            t(loc),
            t(rows),
            t(lens),
            t(ext),
            t(starts),
            req_to_token.to(device=dev, dtype=torch.int32),
            t(logit_rows),
            None if custom_mask is None else custom_mask.to(device=dev, dtype=torch.bool),
            None if indptr is None else t(indptr),
            seq_lens_cpu=tuple(lens),
            extend_lens_cpu=tuple(ext),
            mask_indptr_cpu=None if indptr is None else tuple(indptr),
        )


def _ints(xs: IntsLike, name: str) -> list[int]:
    if isinstance(xs, torch.Tensor):
        if xs.dim() != 1 or xs.is_floating_point():
            raise ValueError(
                f"{name} must be a 1-D integer tensor, got {tuple(xs.shape)} {xs.dtype}"
            )
        return xs.tolist()
    return [int(x) for x in xs]


def _check_lengths(
    ext: list[int], lens: list[int], rows: list[int], num_tokens: int, req_to_token: torch.Tensor
) -> None:
    if not len(ext) == len(lens) == len(rows):
        raise ValueError(
            f"extend_lens ({len(ext)}), seq_lens ({len(lens)}) and req_pool_indices "
            f"({len(rows)}) need one entry per request"
        )
    if sum(ext) != num_tokens:
        raise ValueError(f"extend_lens sum to {sum(ext)} but there are {num_tokens} input ids")
    max_reqs, max_len = req_to_token.shape
    for n, s, r in zip(ext, lens, rows):
        if not 1 <= n <= s <= max_len:
            raise ValueError(
                f"need 1 <= extend_len ({n}) <= seq_len ({s}) <= req_to_token width ({max_len})"
            )
        if not 0 <= r < max_reqs:
            raise ValueError(f"req_pool_index {r} outside req_to_token's {max_reqs} rows")
