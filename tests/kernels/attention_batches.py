"""Random hybrid batches over a paged KV pool, laid out as the runtime lays them out."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    extend_start_loc: torch.Tensor

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.req_to_token, self.req_pool_indices, self.seq_lens, self.extend_lens,
                self.extend_start_loc)  # fmt: skip


def make_batch(seq_lens, extend_lens, num_q_heads, num_kv_heads, head_dim, dtype, device):
    """Slots are a random permutation of the pool (slot 0, the dummy, is never used and holds
    huge values so reading it shows); requests sit at shuffled rows of a larger req_to_token
    whose unused entries point at real slots."""
    b = len(seq_lens)
    num_slots = sum(seq_lens) + 7
    k_buffer = torch.randn(num_slots + 1, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_buffer = torch.randn_like(k_buffer)
    k_buffer[0] = 1e4
    v_buffer[0] = 1e4
    max_ctx = max(seq_lens) + 5
    req_to_token = torch.randint(1, num_slots + 1, (b + 3, max_ctx), dtype=torch.int32)
    pool = torch.randperm(b + 3)[:b]
    slots = torch.randperm(num_slots)[: sum(seq_lens)] + 1
    offset = 0
    for i, s in enumerate(seq_lens):
        req_to_token[pool[i], :s] = slots[offset : offset + s].int()
        offset += s
    ext = torch.tensor(extend_lens, dtype=torch.int32)
    q = torch.randn(sum(extend_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    return Batch(
        q, k_buffer, v_buffer, req_to_token.to(device), pool.int().to(device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device), ext.to(device),
        (torch.cumsum(ext, 0) - ext).int().to(device),
    )  # fmt: skip


def tree_mask(seq_len: int, extend_len: int, generator: torch.Generator) -> torch.Tensor:
    """[extend_len, seq_len] bool: the prefix is visible; each new token sees itself and its
    ancestors in a random tree over the new tokens (token i's parent is some j < i)."""
    prefix = seq_len - extend_len
    mask = torch.zeros(extend_len, seq_len, dtype=torch.bool)
    mask[:, :prefix] = True
    for i in range(extend_len):
        mask[i, prefix + i] = True
        if i:
            parent = int(torch.randint(0, i, (1,), generator=generator))
            mask[i, prefix : prefix + i] = mask[parent, prefix : prefix + i]
            mask[i, prefix + parent] = True
    return mask
