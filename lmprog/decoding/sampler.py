"""The batched token sampler shared by every backend (llama.cpp: B=1; the runtime: B=many).

    out = sample(logits, SamplingTensors.from_params(...))   # [B, V] -> one token per row

Per row: penalties, min_tokens ban, constraint bitmask, then argmax or temperature, top-k,
top-p, min-p and an inverse-CDF draw (seeded rows through rng.py). Logprobs are the raw
model's. Never waits for the device; a row with nothing left gets NO_TOKEN. Written once
over arrays.ArrayOps (torch or numpy). Order of operations: docs/design/sampling.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.sampling import SamplingParams
from lmprog.fsm.mask import apply_bitmask_, check_bitmask

from .array_ops import ops_for, ops_on
from .arrays import Array, ArrayOps
from .rng import SeededGenerator, uniforms

_NEG_INF = float("-inf")
NO_TOKEN = -1  # the token id of a row with no token left to sample


@dataclass(frozen=True)
class SamplingTensors:
    """The per-row parameters of one batch as arrays; build once per batch composition.

    `ban_rows`/`ban_tokens` list (row, token) pairs that are masked while that row has fewer
    than `min_tokens` output tokens (its EOS ids unless `ignore_eos`, and its stop_token_ids).
    The `any_*` flags let `sample` skip work no row asks for.
    """

    temperature: Array  # [B] float32; 1.0 on greedy rows (never divided by 0)
    greedy: Array  # [B] bool
    top_k: Array  # [B] int64; 0 where disabled
    top_p: Array  # [B] float32
    min_p: Array  # [B] float32
    frequency_penalty: Array  # [B] float32
    presence_penalty: Array  # [B] float32
    repetition_penalty: Array  # [B] float32; 1.0 where disabled
    min_tokens: Array  # [B] int64
    ban_rows: Array  # [N] int64
    ban_tokens: Array  # [N] int64
    all_greedy: bool
    any_greedy: bool
    any_top_k: bool
    max_top_k: int  # the largest top_k of a sampled row (host copy: no device read)
    any_top_p: bool
    any_min_p: bool
    any_penalty: bool
    any_repetition: bool
    any_min_tokens: bool
    return_logprob: bool
    max_top_logprobs: int

    @property
    def batch_size(self) -> int:
        return int(self.greedy.shape[0])

    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        *,
        eos_token_ids: Sequence[int] = (),
        device: Any = "cpu",
    ) -> SamplingTensors:
        """Arrays for `params` (one per row) on `device` (a torch device, or None: numpy);
        `eos_token_ids` end generation unless ignore_eos."""
        if not params:
            raise ValueError("from_params needs at least one SamplingParams")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"expected SamplingParams, got {type(p).__name__}")
        col = ops_on(device).asarray
        greedy = [p.greedy for p in params]
        ban = [
            (i, t)
            for i, p in enumerate(params)
            if p.min_tokens > 0
            for t in _stop_ids(p, eos_token_ids)
        ]
        return cls(
            temperature=col(
                [1.0 if g else p.temperature for g, p in zip(greedy, params)], "float32"
            ),
            greedy=col(greedy, "bool"),
            top_k=col([max(p.top_k, 0) for p in params], "int64"),
            top_p=col([p.top_p for p in params], "float32"),
            min_p=col([p.min_p for p in params], "float32"),
            frequency_penalty=col([p.frequency_penalty for p in params], "float32"),
            presence_penalty=col([p.presence_penalty for p in params], "float32"),
            repetition_penalty=col([p.repetition_penalty for p in params], "float32"),
            min_tokens=col([p.min_tokens for p in params], "int64"),
            ban_rows=col([r for r, _ in ban], "int64"),
            ban_tokens=col([t for _, t in ban], "int64"),
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            any_top_k=any(p.top_k > 0 and not g for g, p in zip(greedy, params)),
            max_top_k=max(max(p.top_k, 0) for p in params),
            any_top_p=any(p.top_p < 1.0 and not g for g, p in zip(greedy, params)),
            any_min_p=any(p.min_p > 0.0 and not g for g, p in zip(greedy, params)),
            any_penalty=any(p.penalised for p in params),
            any_repetition=any(p.repetition_penalty != 1.0 for p in params),
            any_min_tokens=bool(ban),
            return_logprob=any(p.return_logprob or p.top_logprobs_num > 0 for p in params),
            max_top_logprobs=max(p.top_logprobs_num for p in params),
        )


def _stop_ids(p: SamplingParams, eos_token_ids: Sequence[int]) -> list[int]:
    ids = list(p.stop_token_ids) if p.ignore_eos else [*eos_token_ids, *p.stop_token_ids]
    return sorted(set(ids))


@dataclass(frozen=True)
class SampleOutput:
    """One sampled token per row, with raw-model logprobs when any row asked for them
    (arrays of the logits' kind)."""

    token_ids: Array  # [B] int64
    logprobs: Array | None = None  # [B] float32: logprob of the chosen token
    top_token_ids: Array | None = None  # [B, K] int64, K = max top_logprobs_num
    top_logprobs: Array | None = None  # [B, K] float32


def sample(
    logits: Array,
    tensors: SamplingTensors,
    *,
    generators: Sequence[SeededGenerator | None] | None = None,
    output_counts: Array | None = None,
    prompt_mask: Array | None = None,
    num_output_tokens: Array | Sequence[int] | None = None,
    bitmask: Array | None = None,
    mask_in_place: bool = False,
) -> SampleOutput:
    """Sample one token per row of `logits` [B, V] (a torch tensor, or a numpy array: then
    every other array is numpy too); token NO_TOKEN (-1) where masks leave a row nothing.
    Never modifies its inputs, except as `mask_in_place` allows.

    generators: per-row seeded generators (None entries, or None: the library's default RNG).
    output_counts: [B, V] counts of each token already generated (for the penalties).
    prompt_mask: bool [B, V], the tokens of each row's prompt (the repetition penalty counts
        them as seen too; None: only the output's).
    num_output_tokens: [B] tokens generated so far (for min_tokens; default 0): a list, or
        an int array on the logits' device.
    bitmask: int32 [B, ceil(V / 32)] constraint mask (`lmprog.fsm.mask`): tokens whose bit
        is 0 are never chosen.
    mask_in_place: the bitmask may be applied to `logits` itself when nothing else changes
        them (applying it twice changes nothing; saves a [B, V] copy on a CPU).
    """
    ops = ops_for(logits)
    _check_inputs(
        ops, logits, tensors, generators, output_counts, num_output_tokens, bitmask, prompt_mask
    )
    logits = ops.astype(logits, "float32")
    raw_logprobs = ops.log_softmax(logits) if tensors.return_logprob else None
    x, empty = _processed_logits(
        ops, logits, tensors, output_counts, num_output_tokens, bitmask, mask_in_place, prompt_mask
    )
    greedy_ids = ops.argmax(x)
    if tensors.all_greedy:
        ids = greedy_ids
    else:
        drawn = _draw(ops, _filtered_probs(ops, x, tensors), generators)
        ids = ops.where(tensors.greedy, greedy_ids, drawn)
    if empty is not None:
        ids = ops.masked_fill(ids, empty, NO_TOKEN)
    return with_logprobs(ids, raw_logprobs, tensors.max_top_logprobs)


def argmax_rows(x: Array) -> Array:
    """x.argmax(dim=-1) for [B, V] x: each row's first maximum, a NaN counting as the
    maximum (through numpy on a CPU: ~10x faster than torch's)."""
    return ops_for(x).argmax(x)


def _check_inputs(
    ops: ArrayOps,
    logits: Array,
    tensors: SamplingTensors,
    generators: Sequence[SeededGenerator | None] | None,
    output_counts: Array | None,
    num_output_tokens: Array | Sequence[int] | None,
    bitmask: Array | None,
    prompt_mask: Array | None = None,
) -> None:
    if not ops.is_array(logits) or logits.ndim != 2:
        raise ValueError(
            f"logits must be a [B, V] array, got {getattr(logits, 'shape', type(logits))}"
        )
    b, v = logits.shape
    if tensors.batch_size != b:
        raise ValueError(
            f"logits has {b} rows but the SamplingTensors describe {tensors.batch_size}"
        )
    if generators is not None and len(generators) != b:
        raise ValueError(f"got {len(generators)} generators for {b} rows")
    if output_counts is not None and tuple(output_counts.shape) != (b, v):
        raise ValueError(
            f"output_counts must have shape {(b, v)}, got {tuple(output_counts.shape)}"
        )
    if prompt_mask is not None and (
        tuple(prompt_mask.shape) != (b, v) or ops.dtype_name(prompt_mask) != "bool"
    ):
        raise ValueError(
            f"prompt_mask must be a bool array of shape {(b, v)}, "
            f"got {prompt_mask.dtype} {tuple(prompt_mask.shape)}"
        )
    if bitmask is not None:
        check_bitmask(logits, bitmask)
    if num_output_tokens is not None and len(num_output_tokens) != b:
        raise ValueError(f"num_output_tokens has {len(num_output_tokens)} entries for {b} rows")


def _processed_logits(
    ops: ArrayOps,
    logits: Array,
    tensors: SamplingTensors,
    output_counts: Array | None,
    num_output_tokens: Array | Sequence[int] | None,
    bitmask: Array | None,
    mask_in_place: bool = False,
    prompt_mask: Array | None = None,
) -> tuple[Array, Array | None]:
    """(logits after penalties, the min_tokens ban and the constraint mask, bool [B] rows
    left without a finite logit or None when nothing masked). The logits are a new array,
    `logits` itself when none applies, or `logits` masked in place when only the mask
    applies and `mask_in_place` allows it (callers never modify the result further)."""
    penalised = tensors.any_penalty and (output_counts is not None or prompt_mask is not None)
    if not penalised and not tensors.any_min_tokens:
        if bitmask is None:
            return logits, None
        x = logits if mask_in_place else ops.copy(logits)
        return apply_bitmask_(x, bitmask), _empty_rows(ops, x)
    x = ops.copy(logits)  # a [B, V] copy costs milliseconds on a CPU at large B
    if penalised:
        in_output = None if output_counts is None else output_counts > 0
        if tensors.any_repetition:
            seen = in_output
            if prompt_mask is not None:
                seen = prompt_mask if seen is None else seen | prompt_mask
            x = repetition_penalised(x, seen, tensors.repetition_penalty)
        if output_counts is not None:
            x -= tensors.frequency_penalty[:, None] * ops.astype(output_counts, "float32")
            x -= tensors.presence_penalty[:, None] * ops.astype(in_output, "float32")
    if tensors.any_min_tokens:
        n_out = _as_long(ops, num_output_tokens, tensors.batch_size)
        rows, tokens = tensors.ban_rows, tensors.ban_tokens
        active = n_out[rows] < tensors.min_tokens[rows]
        # every (row, token) pair written, the inactive ones with their own value: a
        # boolean index would wait for the device to count the active ones
        ops.index_put_(x, rows, tokens, ops.masked_fill(x[rows, tokens], active, _NEG_INF))
    if bitmask is None and not tensors.any_min_tokens:
        return x, None  # penalties alone leave every row its tokens
    if bitmask is not None:
        apply_bitmask_(x, bitmask)
    return x, _empty_rows(ops, x)


def repetition_penalised(x: Array, seen: Array, penalty: Array) -> Array:
    """x [B, V] with CTRL's repetition penalty [B] applied where `seen` [B, V] is true: a
    positive logit divided by the penalty, a negative one multiplied by it (the rest kept)."""
    ops, p = ops_for(x), penalty[:, None]
    return ops.where(seen, ops.where(x > 0, x / p, x * p), x)


def _empty_rows(ops: ArrayOps, x: Array) -> Array:
    """bool [B]: rows without a finite logit (masks can leave a row nothing to sample)."""
    return ~ops.isfinite(ops.amax(x))


def _as_long(ops: ArrayOps, values: Array | Sequence[int] | None, batch_size: int) -> Array:
    if values is None:
        return ops.zeros(batch_size, "int64")
    if ops.is_array(values):
        return ops.astype(values, "int64")
    return ops.asarray(list(values), "int64")


def _filtered_probs(ops: ArrayOps, x: Array, tensors: SamplingTensors) -> Array:
    """Temperature, then top-k, top-p and min-p; filtered-out tokens get probability 0."""
    probs = ops.softmax(x / tensors.temperature[:, None])
    if tensors.any_top_k or tensors.any_top_p:
        probs = probs * _top_k_top_p_keep(probs, tensors)
    if tensors.any_min_p:
        threshold = tensors.min_p[:, None] * ops.amax(probs, keepdims=True)
        probs = ops.masked_fill(probs, probs < threshold, 0.0)
    return probs


_TOP_CANDIDATES = 256  # top-k/top-p cut-offs almost always fall inside this many tokens


def _top_k_top_p_keep(
    probs: Array, tensors: SamplingTensors, full_sort: bool | None = None
) -> Array:
    """Bool [B, V]: the tokens top-k and top-p keep.

    A full sort of V=49k floats costs milliseconds on a CPU, so there the cut-off is looked
    for among the top `_TOP_CANDIDATES` first, and the window grows 8x while some row's
    cut-off lies beyond it (a flat distribution with top_p near 1). On a GPU the full sort
    is cheap and asking whether the window sufficed would wait for the device (overlap
    scheduling queues the draws without waiting), so it sorts everything
    (`full_sort`: None = by device).
    """
    ops = ops_for(probs)
    vocab = probs.shape[-1]
    enabled_k = tensors.top_k > 0
    if full_sort is None:
        full_sort = ops.device is not None and ops.device.type != "cpu"
    k_max = tensors.max_top_k if tensors.any_top_k else 0
    n = vocab if full_sort else min(vocab, max(_TOP_CANDIDATES, k_max))
    keep_sorted, idx, determined = _keep_among_top(ops, probs, tensors, n)
    while n < vocab and not bool(determined.all()):
        n = min(vocab, n * 8)
        keep_sorted, idx, determined = _keep_among_top(ops, probs, tensors, n)
    filtered = enabled_k | (tensors.top_p < 1.0)
    keep = ops.scatter_(ops.zeros_like(probs, "bool"), idx, keep_sorted)
    return keep | ~filtered[:, None]


def _keep_among_top(
    ops: ArrayOps, probs: Array, tensors: SamplingTensors, n: int
) -> tuple[Array, Array, Array]:
    """(keep [B, n] bool, idx [B, n] of the top n, determined [B] bool: the cut-off lies
    inside the window)."""
    vals, idx = ops.topk(probs, n)  # sorted descending
    positions = ops.arange(n)[None, :]
    k = ops.where(tensors.top_k > 0, tensors.top_k, n)
    keep = positions < k[:, None]
    vals = vals * keep
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass
    # strictly before it already does. The first token always survives.
    mass_before = ops.cumsum(vals) - vals
    keep &= ~((mass_before >= tensors.top_p[:, None]) & (tensors.top_p < 1.0)[:, None])
    # The cut-off lies inside the window when top-k cut there (n >= every k), when top-p is
    # off, or when the window already holds top_p of the mass.
    determined = (tensors.top_k > 0) | (tensors.top_p >= 1.0) | (ops.sum(vals) >= tensors.top_p)
    return keep, idx, determined


def _draw(
    ops: ArrayOps, probs: Array, generators: Sequence[SeededGenerator | None] | None
) -> Array:
    """Inverse-CDF sampling: one uniform per row, so seeded rows are batch-independent."""
    u = uniforms(generators, probs.shape[0], ops.device)
    cdf = ops.cumsum(probs)
    # 1 - u lies in (0, 1], so the target is > 0 and <= the total mass: a token of zero
    # probability (a flat step of the cdf) can never be the first index reaching it.
    target = (1.0 - u) * cdf[:, -1]
    return ops.clamp(ops.searchsorted(cdf, target), hi=probs.shape[-1] - 1)


def probabilities(
    logits: Array,
    tensors: SamplingTensors,
    *,
    output_counts: Array | None = None,
    prompt_mask: Array | None = None,
    num_output_tokens: Array | Sequence[int] | None = None,
    bitmask: Array | None = None,
) -> Array:
    """[B, V] float32: the distribution `sample` draws each row from with the same inputs
    (penalties, min_tokens ban, mask, temperature, top-k/p, min-p), normalised; one-hot at
    the argmax on greedy rows; all zeros on a row the masks leave nothing. Speculative
    decoding's rejection rule needs it explicitly."""
    ops = ops_for(logits)
    _check_inputs(
        ops, logits, tensors, None, output_counts, num_output_tokens, bitmask, prompt_mask
    )
    x, empty = _processed_logits(
        ops,
        ops.astype(logits, "float32"),
        tensors,
        output_counts,
        num_output_tokens,
        bitmask,
        prompt_mask=prompt_mask,
    )
    probs = _filtered_probs(ops, x, tensors)
    probs = probs / ops.sum(probs, keepdims=True)
    if tensors.any_greedy:
        one_hot = ops.scatter_(ops.zeros_like(probs), ops.argmax(x)[:, None], 1.0)
        probs = ops.where(tensors.greedy[:, None], one_hot, probs)
    if empty is not None:
        probs = ops.masked_fill(probs, empty[:, None], 0.0)
    return probs


def draw(probs: Array, generators: Sequence[SeededGenerator | None] | None = None) -> Array:
    """One token per row of `probs` [B, V] (non-negative, not necessarily normalised) by
    inverse-CDF sampling with one uniform per row, from that row's generator as in `sample`."""
    return _draw(ops_for(probs), probs, generators)


def with_logprobs(ids: Array, raw_logprobs: Array | None, k: int) -> SampleOutput:
    """ids [B] with their raw logprobs and top-k alternatives from raw_logprobs [B, V]
    (None: ids only; k <= 0: no alternatives). A NO_TOKEN row gets token 0's, unread."""
    if raw_logprobs is None:
        return SampleOutput(token_ids=ids)
    ops = ops_for(raw_logprobs)
    chosen = ops.take_along(raw_logprobs, ops.clamp(ids, lo=0)[:, None])[:, 0]
    if k <= 0:
        return SampleOutput(token_ids=ids, logprobs=chosen)
    values, indices = ops.topk(raw_logprobs, min(k, raw_logprobs.shape[-1]))
    return SampleOutput(token_ids=ids, logprobs=chosen, top_token_ids=indices, top_logprobs=values)
