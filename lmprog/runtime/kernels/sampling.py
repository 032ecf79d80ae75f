"""Choosing the next token of every row of a batch on the device, with no host sync.

Pipeline per step (each stage optional, all per-row parameters are device tensors):

    process_logits (logits.py)  penalties, bias, constraint bitmask, temperature, in place
    top_k_top_p_min_p           filters by rank / cumulative mass / ratio to the top token;
                                plain torch ops (one sort of the batch): a kernel would save
                                little next to the sort, and rows without filters skip it
    sample_tokens               one Triton pass a row: greedy rows take the argmax, the others
                                the Gumbel-max argmax(logits + G) with G drawn by Philox from
                                (seed, step, token id) - reproducible per request, no
                                per-row generator objects, no torch.multinomial

The Gumbel-max draw is an exact sample from softmax(logits): P(argmax = v) = p_v.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import INDEX_DTYPES, check_runnable, check_shape, check_tensor

BLOCK_V = 1024
_STEP_MIX = tl.constexpr(0x9E3779B1)  # spreads consecutive steps of one seed across Philox keys


def top_k_top_p_min_p(
    logits: torch.Tensor,
    *,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Set filtered-out logits of fp32 [B, V] to -inf (a new tensor). top_k: int [B], values
    < 1 disable it; top_p: fp32 [B] in (0, 1]; min_p: fp32 [B] in [0, 1]. As in transformers,
    top-p and min-p apply to the distribution that survives top-k; the top token always stays."""
    check_tensor("logits", logits, ndim=2, dtypes=(torch.float32,))
    b, v = logits.shape
    for name, t, dtypes in (("top_k", top_k, INDEX_DTYPES), ("top_p", top_p, (torch.float32,)),
                            ("min_p", min_p, (torch.float32,))):  # fmt: skip
        if t is not None:
            check_tensor(name, t, ndim=1, dtypes=dtypes, device=logits.device)
            check_shape(name, t, (b,))
    if top_k is None and top_p is None and min_p is None:
        return logits.clone()
    ranked, order = logits.sort(dim=-1, descending=True)
    remove = torch.zeros_like(ranked, dtype=torch.bool)
    if top_k is not None:
        k = torch.where(top_k < 1, v, top_k.long())[:, None]
        remove |= torch.arange(v, device=logits.device)[None, :] >= k
    probs = ranked.masked_fill(remove, float("-inf")).softmax(dim=-1)
    if top_p is not None:
        remove |= (probs.cumsum(dim=-1) - probs) > top_p[:, None]
    if min_p is not None:
        remove |= probs < min_p[:, None] * probs[:, :1]
    remove[:, 0] = False
    ranked = ranked.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, ranked)


def sample_tokens(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    *,
    greedy: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next token of each row of processed fp32 logits [B, V] (temperature already applied):
    argmax for rows with greedy[b], else a Gumbel-max sample keyed by (seeds[b], steps[b]).
    seeds/steps: int64 [B]; greedy: bool [B] (None: sample every row). Returns int64 [B]."""
    check_tensor("logits", logits, ndim=2, dtypes=(torch.float32,))
    check_runnable("logits", logits)
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous in its last dimension")
    b, v = logits.shape
    for name, t in (("seeds", seeds), ("steps", steps)):
        check_tensor(name, t, ndim=1, dtypes=(torch.int64,), device=logits.device)
        check_shape(name, t, (b,))
    if greedy is not None:
        check_tensor("greedy", greedy, ndim=1, dtypes=(torch.bool,), device=logits.device)
        check_shape("greedy", greedy, (b,))
    if v == 0:
        raise ValueError("logits has an empty vocabulary")
    if out is None:
        out = torch.empty(b, dtype=torch.int64, device=logits.device)
    check_tensor("out", out, ndim=1, dtypes=(torch.int64,), device=logits.device)
    check_shape("out", out, (b,))
    if b:
        _sample_kernel[(b,)](
            logits, seeds, steps, greedy if greedy is not None else seeds, out, v,
            logits.stride(0), HAS_GREEDY=greedy is not None,
            BLOCK_V=min(BLOCK_V, max(16, triton.next_power_of_2(v))), num_warps=4,
        )  # fmt: skip
    return out


def sample_tokens_ref(logits: torch.Tensor, greedy: torch.Tensor | None, generator=None):
    """Reference with torch's own RNG: the same distribution as `sample_tokens`, not the
    same draws. Returns int64 [B]."""
    probs = logits.softmax(dim=-1)
    drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
    if greedy is None:
        return drawn
    return torch.where(greedy, logits.argmax(dim=-1), drawn)


@triton.jit
def _sample_kernel(
    L, Seeds, Steps, Greedy, Out, vocab, stride_l,
    HAS_GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(Seeds + row) ^ (tl.load(Steps + row) * _STEP_MIX)
    noisy = 1
    if HAS_GREEDY:
        noisy = 1 - tl.load(Greedy + row).to(tl.int32)
    best = float("-inf")
    best_i = 0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        ok = offs < vocab
        x = tl.load(L + row * stride_l + offs, mask=ok, other=float("-inf"))
        u = tl.rand(key, offs)  # [0, 1)
        gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-20)))
        x = tl.where(noisy != 0, x + gumbel, x)
        x = tl.where(ok, x, float("-inf"))
        m = tl.max(x, 0)
        i = tl.argmax(x, 0) + start
        better = m > best  # strict: the first maximum wins, as in torch.argmax
        best_i = tl.where(better, i, best_i)
        best = tl.where(better, m, best)
    tl.store(Out + row, best_i.to(tl.int64))
