"""Per-step logit processing for a batch in one pass, in place, with no host sync:

    logits[b, v] -= frequency_penalty[b] * counts[b, v] + presence_penalty[b] * (counts > 0)
    logits[b, v] += bias[b, v]
    logits[b, v]  = -inf  where bit v of allowed_bitmask[b] is 0      (constraint masks)
    logits[b, v] /= temperature[b]                  (rows with temperature <= 0 left as is)

`allowed_bitmask` packs a [B, V] bool mask into int32 [B, ceil(V / 32)] words, bit v % 32 of
word v // 32 (`pack_bitmask`): 32x less to copy to the device each step than a bool mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check_runnable, check_shape, check_tensor

BLOCK_V = 2048  # a multiple of 32: whole bitmask words per block


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, V] -> int32 [B, ceil(V / 32)] (bit v % 32 of word v // 32 = allowed[b, v])."""
    check_tensor("allowed", allowed, ndim=2, dtypes=(torch.bool,))
    b, v = allowed.shape
    words = (v + 31) // 32
    padded = torch.zeros(b, words * 32, dtype=torch.int64, device=allowed.device)
    padded[:, :v] = allowed.to(torch.int64)
    shifts = torch.arange(32, device=allowed.device, dtype=torch.int64)
    packed = (padded.view(b, words, 32) << shifts).sum(-1)  # < 2^32: exact in int64
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, W] -> bool [B, vocab_size]; the inverse of `pack_bitmask`."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.flatten(1)[:, :vocab_size].bool()


def process_logits(
    logits: torch.Tensor,
    *,
    temperatures: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    allowed_bitmask: torch.Tensor | None = None,
    token_counts: torch.Tensor | None = None,
    frequency_penalties: torch.Tensor | None = None,
    presence_penalties: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply penalties, bias, the constraint mask and temperature to fp32 logits [B, V] in
    place (see the module docstring); returns logits. Penalties need `token_counts`
    (int32 [B, V], tokens generated so far) and both penalty tensors (fp32 [B])."""
    args = _check(logits, temperatures, bias, allowed_bitmask, token_counts,
                  frequency_penalties, presence_penalties)  # fmt: skip
    b, v = logits.shape
    if b == 0 or v == 0:
        return logits
    temps, bias_, mask, counts, freq, pres = (logits if a is None else a for a in args)
    _process_logits_kernel[(b, triton.cdiv(v, BLOCK_V))](
        logits, temps, bias_, mask, counts, freq, pres, v,
        logits.stride(0), bias_.stride(0), mask.stride(0), counts.stride(0),
        HAS_TEMP=temperatures is not None, HAS_BIAS=bias is not None,
        HAS_MASK=allowed_bitmask is not None, HAS_PENALTY=token_counts is not None,
        BLOCK_V=BLOCK_V, num_warps=4,
    )  # fmt: skip
    return logits


def process_logits_ref(
    logits: torch.Tensor,
    *,
    temperatures=None,
    bias=None,
    allowed_bitmask=None,
    token_counts=None,
    frequency_penalties=None,
    presence_penalties=None,
) -> torch.Tensor:
    """Out-of-place reference of `process_logits`."""
    out = logits.clone()
    if token_counts is not None:
        c = token_counts.float()
        out -= frequency_penalties[:, None] * c + presence_penalties[:, None] * (c > 0).float()
    if bias is not None:
        out += bias
    if allowed_bitmask is not None:
        allowed = unpack_bitmask(allowed_bitmask, out.shape[1])
        out = out.masked_fill(~allowed, float("-inf"))
    if temperatures is not None:
        t = temperatures[:, None]
        out = torch.where(t > 0, out / torch.where(t > 0, t, 1.0), out)
    return out


def _check(logits, temperatures, bias, bitmask, counts, freq, pres):
    check_tensor("logits", logits, ndim=2, dtypes=(torch.float32,))
    check_runnable("logits", logits)
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous in its last dimension")
    b, v = logits.shape
    dev = logits.device
    if temperatures is not None:
        check_tensor("temperatures", temperatures, ndim=1, dtypes=(torch.float32,), device=dev)
        check_shape("temperatures", temperatures, (b,))
    if bias is not None:
        check_tensor("bias", bias, ndim=2, dtypes=(torch.float32,), device=dev)
        check_shape("bias", bias, (b, v))
    if bitmask is not None:
        check_tensor("allowed_bitmask", bitmask, ndim=2, dtypes=(torch.int32,), device=dev)
        check_shape("allowed_bitmask", bitmask, (b, (v + 31) // 32))
    if (counts is None) != (freq is None) or (counts is None) != (pres is None):
        raise ValueError(
            "penalties need token_counts, frequency_penalties and presence_penalties together"
        )
    if counts is not None:
        check_tensor("token_counts", counts, ndim=2, dtypes=(torch.int32,), device=dev)
        check_shape("token_counts", counts, (b, v))
        for name, t in (("frequency_penalties", freq), ("presence_penalties", pres)):
            check_tensor(name, t, ndim=1, dtypes=(torch.float32,), device=dev)
            check_shape(name, t, (b,))
    for name, t in (("bias", bias), ("allowed_bitmask", bitmask), ("token_counts", counts)):
        if t is not None and t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    return temperatures, bias, bitmask, counts, freq, pres


@triton.jit
def _process_logits_kernel(
    L, Temp, Bias, Mask, Counts, Freq, Pres, vocab, stride_l, stride_b, stride_m, stride_c,
    HAS_TEMP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_PENALTY: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    ok = offs < vocab
    x = tl.load(L + row * stride_l + offs, mask=ok, other=0.0)
    if HAS_PENALTY:
        c = tl.load(Counts + row * stride_c + offs, mask=ok, other=0).to(tl.float32)
        freq = tl.load(Freq + row)
        pres = tl.load(Pres + row)
        x = x - freq * c - pres * (c > 0).to(tl.float32)
    if HAS_BIAS:
        x = x + tl.load(Bias + row * stride_b + offs, mask=ok, other=0.0)
    if HAS_MASK:
        word = tl.load(Mask + row * stride_m + offs // 32, mask=ok, other=0)
        allowed = ((word >> (offs % 32)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    if HAS_TEMP:
        t = tl.load(Temp + row)
        x = x / tl.where(t > 0.0, t, 1.0)
    tl.store(L + row * stride_l + offs, x, mask=ok)
