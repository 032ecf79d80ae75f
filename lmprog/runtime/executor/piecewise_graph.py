"""Piecewise CUDA graphs: steps that are not pure decodes replayed from graphs of everything
but attention. Prefill chunks, mixed batches and verify rows, per bucketed token count.

    graphs = PiecewiseGraphRunner(model, kv, req_to_token, max_tokens=8192)
    logits = graphs.maybe_run(batch, kv)      # None: not served (decode-only, too many tokens)
    logits, hidden = graphs.maybe_run_capture(batch, kv, capture)  # built with hidden=capture

Attention runs eagerly between the L + 1 captured segments; without CUDA the same padded,
segmented forward runs eagerly. Built for a draft head (hidden: its HiddenCapture), segment i
also copies the residual stream entering layer i into a static buffer when the head reads
it (forward_capture's states, verify steps included). Design: docs/design/cuda-graphs.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from .cuda_graph import supports_cuda_graphs
from .forward_batch import ForwardBatch
from .kv_pool import KVPool

if TYPE_CHECKING:
    from ..layers.attention.triton_backend import TritonAttentionBackend
    from ..models.llama import DecoderLayerPart, HiddenCapture, LlamaForCausalLM

log = logging.getLogger(__name__)

DEFAULT_TOKEN_BUCKETS = (
    16,
    32,
    64,
    128,
    256,
    384,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
    12288,
    16384,
)  # capped at the runner's max_tokens


def capture_piecewise_graphs(
    model: LlamaForCausalLM,
    kv: KVPool,
    req_to_token: torch.Tensor,
    *,
    max_tokens: int,
    hidden: HiddenCapture | None = None,
) -> PiecewiseGraphRunner | None:
    """Piecewise graphs for steps of up to max_tokens tokens, or None where graphs are not
    used (not on CUDA, or attention not on the Triton backend) or their activations do not
    fit next to the KV pool (logged; those steps then run eagerly). hidden: a draft head's
    capture (see PiecewiseGraphRunner)."""
    if req_to_token.device.type != "cuda" or not supports_cuda_graphs(model):
        return None
    try:
        with torch.inference_mode():
            return PiecewiseGraphRunner(
                model, kv, req_to_token, max_tokens=max_tokens, hidden=hidden
            )
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        log.warning(
            "piecewise CUDA graphs for %d-token steps do not fit in GPU memory; "
            "non-decode steps run eagerly (lower max_num_batched_tokens or the KV "
            "memory fraction to get them)",
            max_tokens,
        )
        return None


@dataclass
class _Bucket:
    """One captured token count: its segments' graphs (None without CUDA) and the tensors
    that cross segment boundaries (the captured outputs replays write into)."""

    tokens: int
    batch: ForwardBatch
    graphs: list[Any]
    q: torch.Tensor  # static: q_i, the input of attention i, copied in by segment i
    out: torch.Tensor  # static: the attention output every segment after the first reads
    captured: torch.Tensor | None  # static: the draft head's layer states (None: no head)
    h: torch.Tensor | None = None  # the last segment's outputs
    residual: torch.Tensor | None = None


class PiecewiseGraphRunner:
    """Captures `model` (a Llama-family module on the Triton attention backend) in segments
    for every token bucket up to `max_tokens`, over `kv` and the runner's `req_to_token`.

    Contract: `maybe_run(batch, kv)` returns the fp32 logits of `model(batch, kv)` (up to
    rounding) and writes the same K/V into the pool, or None when the batch is not served
    (decode-only batches, which the decode graphs take; more tokens than the largest bucket;
    another pool). Single-threaded; construct and call under the same inference mode.
    hidden: a draft head's HiddenCapture; `maybe_run_capture(batch, kv, hidden)` then returns
    `model.forward_capture`'s (logits, hidden states) (the states copied out of the static
    buffer the segments write: a head keeps them past the step).
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv: KVPool,
        req_to_token: torch.Tensor,
        *,
        max_tokens: int,
        buckets: Sequence[int] = DEFAULT_TOKEN_BUCKETS,
        capture: bool | None = None,
        hidden: HiddenCapture | None = None,
    ) -> None:
        if not supports_cuda_graphs(model):
            raise ValueError(
                "piecewise CUDA graphs need the model's attention on the Triton "
                "backend; load it with attention='triton'"
            )
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        sizes = sorted({b for b in buckets if b < max_tokens} | {max_tokens})
        device = req_to_token.device
        self.model = model
        self.kv = kv
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and device.type != "cuda":
            raise ValueError("capture=True needs CUDA tensors")
        att = model.attention  # this rank's heads under tensor parallelism
        self.ints = torch.zeros(3, sizes[-1], dtype=torch.int64, device=device)  # ids, pos, loc
        rows = (sizes[-1], att.num_heads)  # latent attention: q longer than out by rope_dim
        self.q = torch.zeros((*rows, att.head_dim + att.rope_dim), dtype=model.dtype, device=device)
        self.out = torch.zeros((*rows, att.head_dim), dtype=model.dtype, device=device)
        self.hidden = hidden
        self.captured = None  # the residual streams a head reads, [tokens, layers * hidden]
        if hidden is not None and hidden.layers:
            width = len(hidden.layers) * model.config.hidden_size
            self.captured = torch.zeros(sizes[-1], width, dtype=model.dtype, device=device)
        self._req_to_token = req_to_token
        self.replays = 0
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        captured = [self._capture(t) for t in reversed(sizes)]  # largest first: pool reuse
        self.buckets: tuple[_Bucket, ...] = tuple(reversed(captured))

    @property
    def _attention(self) -> TritonAttentionBackend:
        return cast("TritonAttentionBackend", self.model.attention)  # supports_cuda_graphs

    @property
    def _layers(self) -> Sequence[DecoderLayerPart]:
        return cast("Sequence[DecoderLayerPart]", self.model.model.layers)

    @property
    def token_buckets(self) -> tuple[int, ...]:
        return tuple(b.tokens for b in self.buckets)

    def can_run(self, batch: ForwardBatch, kv: KVPool) -> bool:
        return (
            kv is self.kv
            and not batch.is_decode_only
            and batch.input_ids.shape[0] <= self.buckets[-1].tokens
            and batch.req_to_token.data_ptr() == self._req_to_token.data_ptr()
        )

    def maybe_run(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor | None:
        """Logits of `batch` through its bucket's segments, or None (see the class)."""
        out = self._run(batch, kv)
        if out is None:
            return None
        _, h, residual = out
        return self.model.logits(h, residual, batch.logits_indices)

    def maybe_run_capture(
        self, batch: ForwardBatch, kv: KVPool, capture: HiddenCapture
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`model.forward_capture(batch, kv, capture)` through the segments: its logits and a
        copy of its hidden states; None when not served or not built for `capture`."""
        if self.hidden is None or capture != self.hidden:
            return None
        out = self._run(batch, kv)
        if out is None:
            return None
        bucket, h, residual = out
        rows = batch.logits_indices
        logits = self.model.logits(h, residual, rows)
        if bucket.captured is not None:
            return logits, bucket.captured[: batch.input_ids.shape[0]].clone()
        normed, _ = self.model.model.norm(h.index_select(0, rows), residual.index_select(0, rows))
        return logits, normed

    def _run(
        self, batch: ForwardBatch, kv: KVPool
    ) -> tuple[_Bucket, torch.Tensor, torch.Tensor] | None:
        """The bucket's replay (or its segments, uncaptured) and its last outputs."""
        if not self.can_run(batch, kv):
            return None
        t = batch.input_ids.shape[0]
        bucket = next(b for b in self.buckets if b.tokens >= t)
        self.ints[:, :t].copy_(torch.stack([batch.input_ids, batch.positions, batch.out_cache_loc]))
        if t < bucket.tokens:  # a larger step may have left real slots here: back to padding
            self.ints[:, t : bucket.tokens].zero_()
        plan = self._attention.plan(batch)
        self.replays += 1
        if bucket.graphs:
            self._replay(bucket, plan)
            h, residual = bucket.h, bucket.residual
            assert h is not None and residual is not None  # captured with the graphs
        else:
            h, residual = self._segments(bucket, plan)
        return bucket, h, residual

    def _replay(self, bucket: _Bucket, plan: Any) -> None:
        attention, layers, kv = self._attention, self._layers, self.kv
        kv.wait_layer(layers[0].self_attn.layer)  # segment i writes layer i's KV (captured:
        bucket.graphs[0].replay()  # the host tier's copies are waited for between replays)
        for i, graph in enumerate(bucket.graphs[1:]):
            attention.forward(
                bucket.q, None, None, layers[i].self_attn.layer, kv, plan, out=bucket.out
            )
            if i + 1 < len(layers):
                kv.wait_layer(layers[i + 1].self_attn.layer)
            graph.replay()

    def _segments(self, bucket: _Bucket, plan: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The uncaptured equivalent of a replay (CPU tests): same buffers, same order."""
        layers = self._layers
        residual, step = self._segment0(bucket)
        for i in range(len(layers)):
            self._attention.forward(
                bucket.q, None, None, layers[i].self_attn.layer, self.kv, plan, out=bucket.out
            )
            h, residual = self._segment(bucket, i + 1, residual, step)
        return h, residual

    # ---- the segments (what each graph records) ------------------------------------------
    def _segment0(self, bucket: _Bucket) -> tuple[torch.Tensor, Any]:
        h, step = self.model.embed(bucket.batch, self.kv, None)
        (q, _, _), residual = self._layers[0].attention_input(h, None, step)
        bucket.q.copy_(q)
        self._take(bucket, 0, residual)
        return residual, step

    def _segment(
        self, bucket: _Bucket, i: int, residual: torch.Tensor, step: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment i >= 1: the rest of layer i-1, then the attention input of layer i."""
        layers = self._layers
        h, residual = layers[i - 1].attention_output(bucket.out, residual)
        if i < len(layers):
            (q, _, _), residual = layers[i].attention_input(h, residual, step)
            bucket.q.copy_(q)
            self._take(bucket, i, residual)  # the norm's add: the stream entering layer i
        elif self._reads(i):
            self._take(bucket, i, h + residual)  # the stream leaving the last layer
        return h, residual

    def _reads(self, layer: int) -> bool:
        """Whether the draft head reads the residual stream entering `layer`."""
        return self.captured is not None and self.hidden is not None and layer in self.hidden.layers

    def _take(self, bucket: _Bucket, layer: int, stream: torch.Tensor) -> None:
        """Copy the residual stream entering `layer` to the head's columns of it, if read."""
        if bucket.captured is None or self.hidden is None or not self._reads(layer):
            return
        width = stream.shape[-1]
        for j, wanted in enumerate(self.hidden.layers):
            if wanted == layer:
                bucket.captured[:, j * width : (j + 1) * width].copy_(stream)

    # ---- capture ---------------------------------------------------------------------------
    def _capture(self, tokens: int) -> _Bucket:
        ids, pos, loc = self.ints[:, :tokens]
        one = self.ints[0, :1]  # any [1] int64 tensor: embed() reads only ids/positions/slots
        batch = ForwardBatch(
            input_ids=ids,
            positions=pos,
            out_cache_loc=loc,
            req_pool_indices=one,
            seq_lens=one,
            extend_lens=one,
            extend_start_loc=one,
            req_to_token=self._req_to_token,
            logits_indices=one,
        )
        captured = None if self.captured is None else self.captured[:tokens]
        bucket = _Bucket(tokens, batch, [], self.q[:tokens], self.out[:tokens], captured)
        if not self.capture:
            return bucket
        # Warm up on a side stream (Triton compiles, cuBLAS picks kernels), then capture each
        # segment in order into the shared pool. The buffers hold padding: only slot 0 is
        # written.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._run_segments_eagerly(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        layers = self._layers
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            residual, step = self._segment0(bucket)
        bucket.graphs.append(graph)
        for i in range(1, len(layers) + 1):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                h, residual = self._segment(bucket, i, residual, step)
            bucket.graphs.append(graph)
        bucket.h, bucket.residual = h, residual
        return bucket

    def _run_segments_eagerly(self, bucket: _Bucket) -> None:
        residual, step = self._segment0(bucket)
        for i in range(1, len(self._layers) + 1):
            _, residual = self._segment(bucket, i, residual, step)
