"""Plain-PyTorch reference of the hybrid attention over the paged KV pool (no triton).

New token i of request b attends to key j iff j <= its position (or as custom_mask says);
q head h reads kv head h // G. Loops over requests on the host: a reference and CPU
fallback, not a fast path. Exact semantics: docs/design/attention.md.
"""

from __future__ import annotations

import torch


def hybrid_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    *,
    sm_scale: float | None = None,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Attention of every new token of the batch; returns a tensor shaped and typed like q.
    An FP8 pool's buffers are read as value * k_scale / v_scale."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k_buffer.shape[1]
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    out = q.new_zeros(q.shape[0], num_q_heads, v_buffer.shape[2])
    lens = zip(
        req_pool_indices.tolist(), seq_lens.tolist(), extend_lens.tolist(),
        extend_start_loc.tolist(),
    )  # fmt: skip
    offsets = _mask_offsets(custom_mask, mask_indptr, seq_lens, extend_lens)
    for b, (r, s, e, start) in enumerate(lens):
        if e == 0:
            continue
        slots = req_to_token[r, :s].long()
        k = (k_buffer[slots].to(compute_dtype) * k_scale).repeat_interleave(group, dim=1)
        v = (v_buffer[slots].to(compute_dtype) * v_scale).repeat_interleave(group, dim=1)
        qb = q[start : start + e].to(compute_dtype)  # [e, Hq, D]
        scores = torch.einsum("ehd,shd->hes", qb, k) * scale
        visible = _visible(custom_mask, offsets[b], s, e, q.device)
        scores = scores.masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows -> zeros
        out[start : start + e] = torch.einsum("hes,shd->ehd", p, v).to(q.dtype)
    return out


def _mask_offsets(custom_mask, mask_indptr, seq_lens, extend_lens) -> list[int]:
    if custom_mask is None:
        return [-1] * seq_lens.numel()
    if mask_indptr is not None:
        return [int(x) for x in mask_indptr.tolist()]
    sizes = (seq_lens.long() * extend_lens.long()).tolist()
    return [sum(sizes[:b]) for b in range(len(sizes))]


def _visible(custom_mask, offset: int, s: int, e: int, device) -> torch.Tensor:
    """Bool [e, s]: may new token i attend to key j."""
    if offset >= 0:
        return custom_mask[offset : offset + e * s].view(e, s).to(device)
    pos = torch.arange(s - e, s, device=device)
    return torch.arange(s, device=device)[None, :] <= pos[:, None]
