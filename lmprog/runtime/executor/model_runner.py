"""ModelRunner: a ScheduledBatch in, next-token logits out; the one place that builds a step's
device tensors.

    runner = ModelRunner(model, kv, req_to_token, ...)
    logits = runner.forward(batch, future=...)      # future: the previous step's tokens

It owns the model, the KV pool and the device mirror of the request-to-token table, replays
CUDA graphs where it can, broadcasts inputs to tensor-parallel ranks and prepares LoRA
layouts; nothing here waits for the device. Design: docs/design/scheduling.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from ..draft_tree import tree_masks
from ..images import step_images
from ..lora.ops import LoraBatch
from ..models.config import local_config
from ..scheduler.batch import ScheduledBatch
from ..scheduler.sinks import KVShift
from .cuda_graph import capture_decode_graphs
from .forward_batch import ForwardBatch
from .kv_pool import KVPool
from .kv_shift import KeyShifter
from .piecewise_graph import capture_piecewise_graphs

if TYPE_CHECKING:
    from ..models.llama import HiddenCapture, LlamaForCausalLM


class StepInputs(NamedTuple):
    """One step's inputs as host arrays: what rank 0 broadcasts under tensor parallelism.
    sync: (row, end) of the req_to_token rows to copy whole (entries flagged sync_row;
    filled only where the table is mirrored)."""

    host: np.ndarray  # int64, the layout in docs/design/scheduling.md
    num_tokens: int
    batch_size: int
    num_logits: int
    sync: tuple[tuple[int, int], ...] = ()
    lora: Any = None  # the step's LoraStepPlan (lmprog.runtime.lora.ops), None: no adapter
    images: Any = None  # (rows, embeds) of the image positions fed (runtime.images), or None
    tree: tuple[tuple[int, ...] | None, ...] | None = None  # ScheduledBatch.trees()


class ModelRunner:
    """Runs `model` (a Llama-family module over the paged pool) on scheduled batches.

    num_slots: usable KV slots; req_to_token: the scheduler's live host table (int32).
    kv_cache_dtype: what the pool stores ("auto": the model's dtype; "fp8_e4m3"), see kv_pool.
    channel: under tensor parallelism (rank 0), where each step's inputs are broadcast
    (lmprog.runtime.parallel.channel); None otherwise.
    lora: the LoraManager of the model's adapters (built around `model` before the runner,
    see lmprog.runtime.lora); None: no adapters.
    hidden: the HiddenCapture of the engine's draft head, None without one: the CUDA graphs
    then also hand over its hidden states (forward_capture's steps replay them).
    Single-threaded: only the engine thread calls `forward`.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_slots: int,
        req_to_token: np.ndarray,
        *,
        cuda_graphs: bool = True,
        piecewise_tokens: int = 0,
        channel: Any = None,
        kv_cache_dtype: str = "auto",
        lora: Any = None,
        hidden: HiddenCapture | None = None,
    ) -> None:
        param = next(model.parameters())
        if channel is not None and getattr(model.config, "vision", None) is not None:
            raise ValueError(
                "a vision-language model does not run under tensor parallelism yet (tp_size=1)"
            )
        self.model = model
        self.lora = lora
        self.config = model.config
        self.channel = channel
        self.device, self.dtype = param.device, param.dtype
        self.kv = KVPool.for_model(
            local_config(model),
            num_slots,
            self.dtype,
            self.device,
            kv_cache_dtype=kv_cache_dtype,
            scales=getattr(model, "kv_cache_scales", None),  # an FP8 checkpoint's, if any
        )
        self._vision = getattr(model.config, "vision", None) is not None
        self._host_table = req_to_token
        self._mirrored = self.device.type != "cpu"
        if self.device.type == "cpu":
            self.req_to_token = torch.from_numpy(req_to_token)  # shared, never stale
        else:
            self.req_to_token = torch.zeros(
                req_to_token.shape, dtype=torch.int32, device=self.device
            )
        self.graphs = self.piecewise = None
        self._key_shifter: KeyShifter | None = None  # built on the first attention-sink shift
        attention = getattr(model, "attention", None)
        if attention is not None:
            attention.warm_up(self.kv, self.req_to_token)
        if cuda_graphs:
            self.graphs = capture_decode_graphs(
                model,
                self.kv,
                self.req_to_token,
                max_batch_size=req_to_token.shape[0],
                lora=lora,
                hidden=hidden,
            )
        if cuda_graphs and piecewise_tokens > 0:
            self.piecewise = capture_piecewise_graphs(
                model, self.kv, self.req_to_token, max_tokens=piecewise_tokens, hidden=hidden
            )

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def forward(self, batch: ScheduledBatch, future: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [len(batch.logits_indices()), vocab] for the batch's wanted positions;
        writes the fed tokens' K/V into the pool. future: the previous step's sampled tokens
        on the device, for the batch's placeholders. Under tensor parallelism the step's
        inputs go to every rank first (a broken group raises ParallelError)."""
        logits, _ = self._forward(batch, future, None)
        return logits

    def forward_capture(
        self, batch: ScheduledBatch, capture: HiddenCapture, future: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits and the hidden states a draft head needs (HiddenCapture, see
        LlamaForCausalLM.forward_capture), through the CUDA graphs when they were built for
        `capture` (ModelRunner's hidden) and serve the step, else eagerly."""
        logits, hidden = self._forward(batch, future, capture)
        assert hidden is not None
        return logits, hidden

    def _forward(
        self, batch: ScheduledBatch, future: torch.Tensor | None, capture: HiddenCapture | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert not batch.is_empty, "nothing to run"
        try:
            step = self.step_inputs(batch)
            if self.lora is not None:
                step = step._replace(lora=self._lora_plan(batch))
            if self._vision:  # a VLM: the image positions this step feeds, if any
                step = step._replace(images=step_images(batch, self.model))
            if self.channel is None:
                return self._run(step, future, capture)
            try:
                self.channel.send(step, future, self._host_table)
                return self._run(step, future, capture)
            except Exception as exc:  # the ranks are out of step: fatal for the group
                raise self.channel.group.failure(exc) from exc
        finally:
            self.end_step()

    def move_kv(self, shift: KVShift) -> None:
        """Do an attention-sink eviction's KV moves (lmprog.runtime.executor.kv_shift), queued on the
        device after the step in flight and before the next step's forward."""
        if self._key_shifter is None:
            self._key_shifter = KeyShifter(self.config)
        src, dst, delta = (_to_device(a, self.device) for a in shift)
        self.kv.fence_loads()
        self._key_shifter.shift(self.kv, src, dst, delta)

    def copy_kv(self, moves: KVShift) -> None:
        """Copy K/V between slots (moves.delta unused: a token tree's accepted path keeps its
        positions), queued on the device before the next forward. Under tensor parallelism
        the moves go to every rank first, each copying its own heads' K/V."""
        if self.channel is not None:
            try:
                self.channel.send_moves(moves)
            except Exception as exc:  # the ranks are out of step: fatal for the group
                raise self.channel.group.failure(exc) from exc
        # one staging copy for both index arrays (a tree's verify moves KV every step)
        src, dst = _to_device(np.stack((moves.src, moves.dst)), self.device)
        with torch.inference_mode():
            self.kv.copy_slots(src, dst)

    def run(self, step: StepInputs, future: torch.Tensor | None = None) -> torch.Tensor:
        """The forward of one step's inputs (every rank of a tensor-parallel group runs it)."""
        return self._run(step, future, None)[0]

    def run_capture(
        self, step: StepInputs, capture: HiddenCapture, future: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`run` with the hidden states `capture` asks for, as forward_capture."""
        logits, hidden = self._run(step, future, capture)
        assert hidden is not None
        return logits, hidden

    def _run(
        self, step: StepInputs, future: torch.Tensor | None, capture: HiddenCapture | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.inference_mode():
            fb = self.device_inputs(step, future)
            if capture is not None:
                return self._run_capture(fb, step.lora, capture)
            return self._run_plain(fb, step.lora), None

    def _run_capture(
        self, fb: ForwardBatch, lora: Any, capture: HiddenCapture
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if lora is None and fb.image_rows is None:  # (graphs embed tokens only)
            for graphs in (self.graphs, self.piecewise):
                out = None if graphs is None else graphs.maybe_run_capture(fb, self.kv, capture)
                if out is not None:  # None: not a step those graphs serve
                    return out
        if lora is None:
            return self.model.forward_capture(fb, self.kv, capture)
        context = self.lora.context
        context.batch = LoraBatch.from_plan(lora, self.device, context.triton)
        try:
            return self.model.forward_capture(fb, self.kv, capture)
        finally:
            context.batch = None

    def _run_plain(self, fb: ForwardBatch, lora: Any) -> torch.Tensor:
        if lora is not None:
            return self._run_lora(fb, lora)
        if fb.image_rows is not None:  # image embeddings: eager (graphs embed tokens only)
            return self.model(fb, self.kv)
        for graphs in (self.graphs, self.piecewise):
            logits = None if graphs is None else graphs.maybe_run(fb, self.kv)
            if logits is not None:  # None: not a step those graphs serve
                return logits
        return self.model(fb, self.kv)

    def end_step(self) -> None:
        """A step's forward pass was queued, failed, or not needed (an empty batch): the host
        tier's copies made ahead meanwhile (staging) are what the next one waits for
        (executor/layer_loads.py)."""
        if self.kv.loads is not None:
            self.kv.loads.step_done()

    def _lora_plan(self, batch: ScheduledBatch) -> Any:
        """Page in the step's adapters; its layout (decode steps: the graphs' block size)."""
        uids = [e.req.lora_id for e in batch.entries]
        decode = batch.num_tokens == len(batch.entries)
        return self.lora.prepare(uids, batch.extend_lens(), block_m=16 if decode else None)

    def _run_lora(self, fb: ForwardBatch, plan: Any) -> torch.Tensor:
        """A step with adapters: the decode graphs' LoRA set, else eagerly."""
        if self.graphs is not None and fb.image_rows is None:
            logits = self.graphs.maybe_run(fb, self.kv, lora=plan)
            if logits is not None:
                return logits

        context = self.lora.context
        context.batch = LoraBatch.from_plan(plan, self.device, context.triton)
        try:
            return self.model(fb, self.kv)
        finally:
            context.batch = None

    def build(self, batch: ScheduledBatch, future: torch.Tensor | None = None) -> ForwardBatch:
        return self.device_inputs(self.step_inputs(batch), future)

    def step_inputs(self, batch: ScheduledBatch) -> StepInputs:
        """The step's integer arrays in one host buffer (docs/design/scheduling.md)."""
        entries = batch.entries
        ext, lens, rows = batch.extend_lens(), batch.seq_lens(), batch.rows()
        starts = np.cumsum(ext) - ext
        logit_rows = batch.logits_indices()
        host = np.concatenate(
            [
                batch.input_ids(),
                batch.positions,
                batch.out_slots.astype(np.int64),
                rows,
                lens,
                ext,
                starts,
                logit_rows,
            ]
        )
        sync: tuple[tuple[int, int], ...] = ()
        if self._mirrored or self.channel is not None:
            sync = tuple((e.row, e.end) for e in entries if e.sync_row)
        trees = batch.trees()
        return StepInputs(host, batch.num_tokens, len(entries), len(logit_rows), sync, tree=trees)

    def device_inputs(self, step: StepInputs, future: torch.Tensor | None = None) -> ForwardBatch:
        t, b = step.num_tokens, step.batch_size
        host = step.host
        parts = _to_device(host, self.device).split([t, t, t, b, b, b, b, step.num_logits])
        ids = parts[0]
        if host[:t].min() < 0:  # placeholders: the previous step's tokens, on the device
            assert future is not None, "placeholder tokens without the step that samples them"
            ids = torch.where(ids < 0, future[(-1 - ids).clamp_(min=0)], ids)
        mask = indptr = None
        indptr_host = None
        if step.tree is not None:  # token-tree verifies: their masks
            lens, ext = host[3 * t + b : 3 * t + 2 * b], host[3 * t + 2 * b : 3 * t + 3 * b]
            mask_host, indptr_host = tree_masks(step.tree, ext, lens)
            mask = _to_device(mask_host, self.device)
            indptr = _to_device(indptr_host, self.device)
        if self._mirrored:
            # the table's column of a fed token: its position, except in a token tree
            # (siblings share a position, each has its own column)
            columns = parts[1] if step.tree is None else _columns(parts[4], parts[5], t)
            self._sync_table(step, parts[3], parts[5], columns, parts[2])
        image_rows = image_embeds = None
        if step.images is not None:
            image_rows = _to_device(step.images[0], self.device)
            image_embeds = step.images[1]
        return ForwardBatch(
            input_ids=ids,
            positions=parts[1],
            out_cache_loc=parts[2],
            req_pool_indices=parts[3],
            seq_lens=parts[4],
            extend_lens=parts[5],
            extend_start_loc=parts[6],
            req_to_token=self.req_to_token,
            logits_indices=parts[7],
            custom_mask=mask,
            mask_indptr=indptr,
            seq_lens_cpu=tuple(host[3 * t + b : 3 * t + 2 * b].tolist()),
            extend_lens_cpu=tuple(host[3 * t + 2 * b : 3 * t + 3 * b].tolist()),
            image_rows=image_rows,
            image_embeds=image_embeds,
            mask_indptr_cpu=None if indptr_host is None else tuple(indptr_host.tolist()),
        )

    def close(self) -> None:
        """Release what outlives the engine thread: a tensor-parallel group's workers, and
        the device memory (the weights, the KV pool and its table, captured graphs), so that
        a Runtime made next in the process sizes its KV pool from the memory left free. The
        runner cannot run a step after."""
        if self.channel is not None:
            self.channel.close()
        self.graphs = self.piecewise = None
        self._key_shifter = None
        for name in ("model", "kv", "req_to_token"):
            vars(self).pop(name, None)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _sync_table(
        self,
        step: StepInputs,
        rows: torch.Tensor,
        ext: torch.Tensor,
        columns: torch.Tensor,
        out_slots: torch.Tensor,
    ) -> None:
        """Bring the device table up to date for this batch's rows (docs/design/scheduling.md).
        columns: each fed token's column in its row."""
        for row, end in step.sync:
            self.req_to_token[row, :end] = _to_device(self._host_table[row, :end], self.device)
        token_rows = torch.repeat_interleave(rows, ext, output_size=step.num_tokens)
        self.req_to_token[token_rows, columns] = out_slots.to(torch.int32)


def _columns(seq_lens: torch.Tensor, ext: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Per fed token, its column in its request's row: seq_len - extend_len + its index."""
    starts = torch.cumsum(ext, 0) - ext
    first = torch.repeat_interleave(seq_lens - ext - starts, ext, output_size=num_tokens)
    return first + torch.arange(num_tokens, device=ext.device)


def _to_device(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """A copy of `host` on `device`, queued without waiting (pinned staging memory, which
    the caching host allocator keeps until the copy is done)."""
    if device.type == "cpu":
        return torch.from_numpy(host)
    return torch.from_numpy(host).pin_memory().to(device, non_blocking=True)
