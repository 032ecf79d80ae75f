"""Decode CUDA graphs: decode-only batches replayed from graphs captured per bucketed batch size.

    graphs = CudaGraphRunner(model, kv, req_to_token)     # captures every bucket, once
    logits = graphs.maybe_run(batch, kv)                  # None: not a graph batch, run eagerly
    logits, hidden = graphs.maybe_run_capture(batch, kv, capture)   # built with hidden=capture

Padding rows write only the pool's dummy slot; without CUDA the same padded forward runs
eagerly. With LoRA each bucket is captured twice (without and with the adapters). Built for a
draft head (hidden: its HiddenCapture), the graphs record forward_capture, whose hidden
states come out of a static buffer beside the logits (plain steps replay them too).
Static buffers, padding and plans: docs/design/cuda-graphs.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..lora.ops import LoraBatch
from .forward_batch import ForwardBatch
from .kv_pool import KVPool

if TYPE_CHECKING:
    from ..models.llama import HiddenCapture, LlamaForCausalLM

DEFAULT_BATCH_SIZES = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    160,
    192,
    224,
    256,
    320,
    384,
    448,
    512,
)  # capped at the runner's max_batch_size
SPLIT_CONTEXT = 4096  # the KV length each bucket's split count is tuned for
_PAD = (0, 0, 0, 0, 1)  # input_id, position, out_cache_loc (dummy slot), table row, seq_len


def capture_decode_graphs(
    model: LlamaForCausalLM,
    kv: KVPool,
    req_to_token: torch.Tensor,
    *,
    max_batch_size: int,
    lora: Any = None,
    hidden: HiddenCapture | None = None,
) -> CudaGraphRunner | None:
    """Decode graphs for batches up to max_batch_size, or None where graphs are not used
    (not on CUDA, or attention not on the Triton backend). Captured under inference mode,
    as the engine replays them. hidden: a draft head's capture (see CudaGraphRunner)."""
    if req_to_token.device.type != "cuda" or not supports_cuda_graphs(model):
        return None
    with torch.inference_mode():
        return CudaGraphRunner(
            model, kv, req_to_token, max_batch_size=max_batch_size, lora=lora, hidden=hidden
        )


def supports_cuda_graphs(model: LlamaForCausalLM) -> bool:
    """True when `model` plans its attention with the Triton backend (the only one whose
    plan can live on static buffers; the torch backend reads lengths on the host)."""
    try:
        from ..layers.attention.triton_backend import TritonAttentionBackend
    except ImportError:  # no triton
        return False
    return isinstance(getattr(model, "attention", None), TritonAttentionBackend)


class DecodeBuffers:
    """The static inputs every decode graph reads (docs/design/cuda-graphs.md)."""

    def __init__(self, max_batch_size: int, req_to_token: torch.Tensor) -> None:
        assert max_batch_size >= 1 and req_to_token.dtype == torch.int32
        dev = req_to_token.device
        self.req_to_token = req_to_token
        self.ints = torch.zeros(5, max_batch_size, dtype=torch.int64, device=dev)
        pad = torch.tensor(_PAD, dtype=torch.int64, device=dev)
        self.pad = pad[:, None].expand(5, max_batch_size).contiguous()
        self.ints.copy_(self.pad)
        self.ones = torch.ones(max_batch_size, dtype=torch.int64, device=dev)
        self.arange = torch.arange(max_batch_size, dtype=torch.int64, device=dev)

    @property
    def max_batch_size(self) -> int:
        return self.ints.shape[1]

    def view(self, bs: int) -> ForwardBatch:
        """The bucket-`bs` batch: views of the static buffers (valid for every replay)."""
        assert 1 <= bs <= self.max_batch_size
        return ForwardBatch.one_token_each(
            tuple(self.ints[:, :bs]), self.ones, self.arange, self.req_to_token
        )

    def load(self, batch: ForwardBatch, bs: int) -> None:
        """Copy a decode batch of n <= bs requests into rows [0, n), padding into [n, bs).
        Three small device ops, no host sync."""
        n = batch.batch_size
        assert n <= bs <= self.max_batch_size
        src = torch.stack(
            [
                batch.input_ids,
                batch.positions,
                batch.out_cache_loc,
                batch.req_pool_indices,
                batch.seq_lens,
            ]
        )
        self.ints[:, :n].copy_(src)
        if n < bs:  # a previous, larger batch may have left real slots here: reset them
            self.ints[:, n:bs].copy_(self.pad[:, n:bs])


LORA_BLOCK_M = 16  # the decode graphs' rows per adapter block


def lora_rows(batch_size: int, slots: int) -> int:
    """The longest layout a decode batch of batch_size requests over `slots` adapters can
    have: each adapter's group padded to LORA_BLOCK_M rows."""
    m = LORA_BLOCK_M
    return -(-(batch_size + min(slots, batch_size) * (m - 1)) // m) * m


class LoraGraphBuffers:
    """The static LoRA layout every LoRA decode graph reads: one int32 buffer holding
    sorted_ids [L], block_slots [L / 16] and num_padded [1], L for the largest bucket.

    A step's layout pads each adapter's group with the step's token count n, which inside a
    bucket of bs > n rows is a padding row: the buffers hold max_batch_size there instead,
    past every bucket's rows, so the kernels mask those entries (else every block would
    compute the padding row n under its own adapter and the blocks race writing it)."""

    def __init__(self, max_batch_size: int, slots: int, device: torch.device) -> None:
        self.max_batch_size = max_batch_size
        self.rows = lora_rows(max_batch_size, slots)
        self.blocks = self.rows // LORA_BLOCK_M
        self.slots = slots
        self.packed = torch.zeros(self.rows + self.blocks + 1, dtype=torch.int32, device=device)

    def view(self, bs: int) -> Any:

        rows = lora_rows(bs, self.slots)
        ids = self.packed[:rows]
        block_slots = self.packed[self.rows : self.rows + rows // LORA_BLOCK_M]
        return LoraBatch(ids, block_slots, self.packed[-1:], LORA_BLOCK_M, None, True)

    def fits(self, plan: Any, bs: int) -> bool:
        return plan.block_m == LORA_BLOCK_M and plan.num_padded <= lora_rows(bs, self.slots)

    def load(self, plan: Any) -> None:
        """Copy a step's layout in: one small host-to-device copy from fresh pinned memory
        (the caching host allocator keeps it until the copy is done), no host sync."""
        host = np.zeros(self.packed.shape[0], dtype=np.int32)
        n, nb = plan.num_padded, len(plan.block_slots)
        ids = plan.sorted_ids
        host[:n] = np.where(ids < plan.num_tokens, ids, self.max_batch_size)
        host[self.rows : self.rows + nb] = plan.block_slots
        host[-1] = n
        staged = torch.from_numpy(host)
        if self.packed.device.type == "cuda":
            staged = staged.pin_memory()
        self.packed.copy_(staged, non_blocking=True)

    def clear(self) -> None:
        self.packed.zero_()  # num_padded 0: every LoRA program returns (warm-up, capture)


@dataclass(frozen=True)
class _Bucket:
    """One captured batch size: its graph (None without CUDA), the static batch and plan it
    was captured on, and the graph's output logits [bs, vocab] (and hidden states [bs, ...]
    when captured for a draft head)."""

    batch_size: int
    batch: ForwardBatch
    plan: Any
    graph: Any  # torch.cuda.CUDAGraph | None
    logits: torch.Tensor | None
    hidden: torch.Tensor | None = None
    lora_batch: Any = None  # the static LoraBatch of the LoRA graph (None: no adapters)
    lora_graph: Any = None
    lora_logits: torch.Tensor | None = None


class CudaGraphRunner:
    """Captures `model`'s decode forward over `kv` and `req_to_token` per batch size.

    `maybe_run(batch, kv)` returns `model(batch, kv)`'s fp32 logits from the graph's output
    buffer (valid until the next call), or None when the batch is not a graph batch.
    hidden: a draft head's HiddenCapture; the graphs then record `model.forward_capture` and
    `maybe_run_capture(batch, kv, hidden)` returns its (logits, hidden states), the hidden
    states copied out of the graph's buffer (a head keeps them past the step).
    Single-threaded; the full contract is in docs/design/cuda-graphs.md.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv: KVPool,
        req_to_token: torch.Tensor,
        *,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        max_batch_size: int | None = None,
        split_context: int = SPLIT_CONTEXT,
        capture: bool | None = None,
        lora: Any = None,
        hidden: HiddenCapture | None = None,
    ) -> None:
        if not supports_cuda_graphs(model):
            raise ValueError(
                "CUDA graphs need the model's attention on the Triton backend; "
                "load it with attention='triton'"
            )
        sizes = _bucket_sizes(batch_sizes, max_batch_size)
        if (
            not isinstance(req_to_token, torch.Tensor)
            or req_to_token.dtype != torch.int32
            or req_to_token.dim() != 2
        ):
            raise ValueError("req_to_token must be the runner's int32 [rows, context] table")
        device = req_to_token.device
        if kv.k[0].device != device:  # (tensors' devices: "cuda" and "cuda:0" compare unequal)
            raise ValueError(f"the KV pool is on {kv.k[0].device} but req_to_token on {device}")
        self.model = model
        self.kv = kv
        self.hidden = hidden
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and device.type != "cuda":
            raise ValueError("capture=True needs CUDA tensors")
        self.split_context = split_context
        self.buffers = DecodeBuffers(sizes[-1], req_to_token)
        self.lora = lora
        self.lora_buffers = (
            LoraGraphBuffers(sizes[-1], lora.pool.slots, device) if lora is not None else None
        )
        self.replays = 0  # batches served (a statistic for benchmarks and metrics)
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        captured = [self._capture(bs) for bs in reversed(sizes)]  # largest first: pool reuse
        self.buckets: tuple[_Bucket, ...] = tuple(reversed(captured))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(b.batch_size for b in self.buckets)

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1].batch_size

    def can_run(self, batch: ForwardBatch, kv: KVPool) -> bool:
        """Whether `batch` is a decode batch these graphs serve (no device access)."""
        table = self.buffers.req_to_token
        return (
            kv is self.kv
            and batch.is_decode_only
            and 1 <= batch.batch_size <= self.max_batch_size
            and batch.logits_indices.shape[0] == batch.batch_size  # then == arange(B)
            and batch.req_to_token.data_ptr() == table.data_ptr()
            and batch.req_to_token.shape == table.shape
            and batch.req_to_token.stride() == table.stride()
        )

    def maybe_run(self, batch: ForwardBatch, kv: KVPool, lora: Any = None) -> torch.Tensor | None:
        """Logits of a decode batch through its bucket's graph, or None (see the class).
        lora: the step's LoraStepPlan (its adapters' graph), None: the plain graph."""
        out = self._maybe_replay(batch, kv, lora, None)
        return None if out is None else out[0]

    def maybe_run_capture(
        self, batch: ForwardBatch, kv: KVPool, capture: HiddenCapture
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`model.forward_capture(batch, kv, capture)` through the bucket's graph: its logits
        (valid until the next call) and a copy of its hidden states; None when the batch is
        not a graph batch or the graphs were not built for `capture`."""
        if self.hidden is None or capture != self.hidden:
            return None
        out = self._maybe_replay(batch, kv, None, capture)
        if out is None:
            return None
        logits, hidden = out
        assert hidden is not None
        return logits, hidden.clone()

    def _maybe_replay(
        self, batch: ForwardBatch, kv: KVPool, lora: Any, capture: HiddenCapture | None
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if not self.can_run(batch, kv):
            return None
        bucket = self._bucket_for(batch.batch_size)
        if lora is not None:
            if self.lora_buffers is None or not self.lora_buffers.fits(lora, bucket.batch_size):
                return None
            self.lora_buffers.load(lora)
        self.buffers.load(batch, bucket.batch_size)
        self.replays += 1
        kv.fence_loads()  # a whole step in one graph: the host tier's copies come first
        n = batch.batch_size
        if lora is not None:
            return self._replay_lora(bucket)[:n], None
        hidden: torch.Tensor | None = None
        if bucket.graph is None and capture is not None:
            logits, hidden = self.model.forward_capture(
                bucket.batch, self.kv, capture, plan=bucket.plan
            )
        elif bucket.graph is None:
            logits = self.model(bucket.batch, self.kv, plan=bucket.plan)
        else:
            bucket.graph.replay()
            assert bucket.logits is not None  # captured with the graph
            logits, hidden = bucket.logits, bucket.hidden
        return logits[:n], None if hidden is None else hidden[:n]

    def _replay_lora(self, bucket: _Bucket) -> torch.Tensor:
        if bucket.lora_graph is not None:
            bucket.lora_graph.replay()
            assert bucket.lora_logits is not None  # captured with the graph
            return bucket.lora_logits
        with self._lora_batch(bucket.lora_batch):
            return self.model(bucket.batch, self.kv, plan=bucket.plan)

    def _lora_batch(self, lora_batch: Any) -> Any:
        context = self.lora.context

        class _Set:
            def __enter__(self) -> None:
                context.batch = lora_batch

            def __exit__(self, *exc: object) -> None:
                context.batch = None

        return _Set()

    def _bucket_for(self, n: int) -> _Bucket:
        for bucket in self.buckets:
            if bucket.batch_size >= n:
                return bucket
        raise AssertionError(f"no bucket for {n} requests; can_run() should have said so")

    def _plan(self, batch: ForwardBatch) -> Any:
        from ..kernels.attention_plan import choose_num_splits, plan_attention

        att = self.model.attention
        bs = batch.batch_size
        splits = choose_num_splits(
            bs * att.num_kv_heads, self.split_context, _num_sms(batch.seq_lens.device)
        )
        return plan_attention(
            batch.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_lens,
            batch.extend_start_loc,
            num_q_heads=att.num_heads,
            num_kv_heads=att.num_kv_heads,
            head_dim=att.head_dim,
            seq_lens_cpu=(1,) * bs,
            extend_lens_cpu=(1,) * bs,
            split_max_tokens=1,
            num_kv_splits=splits,
        )

    def _capture(self, bs: int) -> _Bucket:
        batch = self.buffers.view(bs)
        plan = self._plan(batch)
        lora_batch = None if self.lora_buffers is None else self.lora_buffers.view(bs)
        if not self.capture:
            return _Bucket(bs, batch, plan, None, None, None, lora_batch)
        graph, logits, hidden = self._capture_one(batch, plan, None, self.hidden)
        if lora_batch is None or self.lora_buffers is None:
            return _Bucket(bs, batch, plan, graph, logits, hidden)
        self.lora_buffers.clear()
        lora_graph, lora_logits, _ = self._capture_one(batch, plan, lora_batch, None)
        return _Bucket(bs, batch, plan, graph, logits, hidden, lora_batch, lora_graph, lora_logits)

    def _capture_one(
        self, batch: ForwardBatch, plan: Any, lora_batch: Any, capture: HiddenCapture | None
    ) -> tuple[Any, Any, Any]:
        """(graph, its logits, its hidden states or None) of the bucket's forward (with
        capture: forward_capture's)."""
        if lora_batch is not None:
            with self._lora_batch(lora_batch):
                return self._capture_one(batch, plan, None, capture)

        def forward() -> tuple[torch.Tensor, torch.Tensor | None]:
            if capture is None:
                return self.model(batch, self.kv, plan=plan), None
            return self.model.forward_capture(batch, self.kv, capture, plan=plan)

        # Warm up on a side stream (Triton compiles, rotary caches its table on the device),
        # then capture; the buffers hold padding, so these runs write only the dummy slot.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits, hidden = forward()
        return graph, logits, hidden


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # any small number: the split counts then cross chunk boundaries in tests
    return torch.cuda.get_device_properties(device).multi_processor_count


def _bucket_sizes(batch_sizes: Sequence[int], max_batch_size: int | None) -> list[int]:
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive ints, got {tuple(batch_sizes)}")
    if max_batch_size is not None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        sizes = [b for b in sizes if b < max_batch_size] + [max_batch_size]
    return sizes
