"""DraftModelProposer: a smaller model of the target's tokenizer drafts k tokens per step.

It runs the runtime's own model classes over its own paged KV pool (draft_cache.py): per
call one batched extend of every request's new tokens, then k - 1 batched decode steps;
greedy requests take the argmax, sampled ones return their draft distributions.
Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lmprog.core.sampling import SamplingParams
from lmprog.decoding.rng import make_generator

from ..executor.cuda_graph import capture_decode_graphs
from ..executor.forward_batch import ForwardBatch
from ..executor.kv_pool import KVPool
from .draft_cache import DraftKVCache
from .draft_job import DraftJob, DraftSampler, DraftTable, catch_up_members, pack_steps
from .proposer import Proposal, ProposalInput, Proposer

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

KV_BUDGET_BYTES = {"cpu": 256 << 20, "cuda": 4 << 30}  # default draft pool size per device type
SPLIT_EXTEND_LIMIT = 4
_EMPTY = Proposal(())


class DraftModelProposer(Proposer):
    """Drafts with `model`, a Llama-family module of the runtime (it may be the target's own
    module: only the KV pool must be separate); vocab_size must equal the target's.

    propose() never fails for lack of memory (idle requests are evicted LRU, then proposals
    come back empty); release(rid) frees rid's slots. Engine thread only.
    Arguments: docs/design/speculative.md.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        *,
        vocab_size: int,
        max_total_tokens: int | None = None,
        max_requests: int = 64,
        context_length: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        config = model.config
        check_vocab(config.vocab_size, vocab_size)
        _check_int("max_requests", max_requests, 1)
        param = next(model.parameters())
        self.model, self.config = model, config
        self.device, self.dtype = param.device, param.dtype
        self.vocab_size = vocab_size
        self.context_length = min(config.max_position, context_length or config.max_position)
        _check_int("context_length", self.context_length, 2)
        if max_total_tokens is None:
            budget = KV_BUDGET_BYTES.get(self.device.type, KV_BUDGET_BYTES["cpu"])
            max_total_tokens = KVPool.size_for_budget(budget, config, self.dtype)
        _check_int("max_total_tokens", max_total_tokens, 1)
        self.kv = KVPool.for_model(config, max_total_tokens, self.dtype, self.device)
        self.cache = DraftKVCache(max_total_tokens, max_requests)
        self.table = DraftTable(max_requests, self.context_length, self.device)
        self.req_to_token = self.table.req_to_token
        attention = getattr(model, "attention", None)
        if attention is not None:  # its kernels compiled now, not at the first proposal
            attention.warm_up(self.kv, self.req_to_token)
        self.graphs = (
            capture_decode_graphs(model, self.kv, self.req_to_token, max_batch_size=max_requests)
            if cuda_graphs
            else None
        )
        # An extend of at most this many tokens per request runs as that many one-token
        # steps: replayed graphs cost less than one eager forward (after a fully accepted
        # chain the extend is 2 tokens: the last draft and the bonus token).
        self.split_extend_limit = SPLIT_EXTEND_LIMIT if self.graphs is not None else 0
        self.num_proposed = 0  # draft tokens handed out
        self.num_skipped = 0  # requests that got an empty proposal for lack of memory

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        model: Any,
        *,
        vocab_size: int,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        load_format: str = "auto",
        attention: str = "auto",
        seed: int = 0,
        **kwargs: Any,
    ) -> DraftModelProposer:
        """Load the draft as the target is loaded (assemble_model): a GGUF file, an HF
        folder or a bundled model name; with load_format="dummy" also an architecture preset
        or a ModelConfig (random weights drawn with `seed`). kwargs go to the constructor."""
        from ..assemble import assemble_model
        from ..models import load_config

        check_vocab(load_config(model).vocab_size, vocab_size)  # before loading any weight
        net = assemble_model(
            model,
            device=device,
            dtype=dtype,
            load_format=load_format,
            attention=attention,
            seed=seed,
        )
        return cls(net, vocab_size=vocab_size, **kwargs)

    # ---- Proposer ------------------------------------------------------------------------
    def propose(self, inputs: Sequence[ProposalInput]) -> list[Proposal]:
        jobs = prepare_and_run(inputs, self._prepare, self._run, self._unwind)
        out = [_EMPTY if j is None else j.proposal() for j in jobs]
        self.num_proposed += sum(len(p.token_ids) for p in out)
        return out

    def _unwind(self, job: DraftJob) -> None:
        """Give back what a failed call reserved; the kept prefix stays valid."""
        self.cache.truncate(job.seq, job.keep)
        if not job.seq.tokens:
            self.cache.release(job.seq.rid)

    def release(self, rid: Hashable) -> None:
        self.cache.release(rid)

    def stats(self) -> dict[str, int]:
        return {
            "draft_requests": len(self.cache),
            "draft_free_slots": self.cache.num_free_slots,
            "draft_tokens_proposed": self.num_proposed,
            "draft_skipped": self.num_skipped,
            "draft_evicted": self.cache.num_evicted,
        }

    def check_integrity(self) -> None:
        """The slot bookkeeping, and the device table agreeing with it (reads the device)."""
        self.cache.check_integrity()
        for seq in self.cache.seqs():
            n = len(seq.tokens)
            assert self.req_to_token[seq.row, :n].tolist() == seq.slots[:n], (
                f"draft table row of {seq.rid!r} disagrees with its slots"
            )

    # ---- one call ------------------------------------------------------------------------
    def _prepare(self, inp: ProposalInput, protect: Collection[Hashable]) -> DraftJob | None:
        """Roll the request's draft state back to what still agrees, reserve its slots."""
        tokens = _checked_tokens(inp)
        n = len(tokens)
        k = min(inp.max_tokens, self.context_length - n + 1)
        if k < 1:  # too long for the draft's table from now on
            self.cache.release(inp.rid)
            return None
        seq = self.cache.get(inp.rid)
        keep = min(common_prefix_len(seq.tokens, tokens), n - 1) if seq is not None else 0
        new = tokens[keep:]  # the last token is always refed: its logits give draft 1
        if min(new) < 0 or max(new) >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        seq = seq or self.cache.open(inp.rid, protect)
        if seq is None:
            self.num_skipped += 1
            return None
        self.cache.truncate(seq, keep)
        if self.cache.reserve(seq, n - keep + k - 1, protect) is None:
            if not seq.tokens:
                self.cache.release(inp.rid)
            self.num_skipped += 1
            return None
        params = inp.params
        if params is not None and params.seed is not None and seq.generator is None:
            seq.generator = make_generator(_draft_seed(params.seed), self.device)
        return DraftJob(seq, tokens, keep, k, params)

    def _run(self, jobs: list[DraftJob]) -> None:
        active = [sum(j.k > s for j in jobs) for s in range(jobs[0].k)]  # jobs sorted by k
        longest = max(len(j.tokens) - j.keep for j in jobs)
        catch_up = longest if 1 < longest <= self.split_extend_limit else 0
        ints = pack_steps(jobs, active, catch_up).send(self.device)
        self.req_to_token[ints["t_rows"], ints["t_cols"]] = ints["t_vals"].to(torch.int32)
        sampler = DraftSampler(jobs, self.device)
        if catch_up:
            logits = self._catch_up(jobs, catch_up, ints)
        else:
            logits = self._forward(self._extend_batch(jobs, ints))
        ids = sampler.choose(logits)
        chosen = [ids]
        for s in range(1, len(active)):
            a = active[s]
            ids = sampler.choose(self._forward(self._decode_batch(ids[:a], jobs[:a], s, ints)))
            chosen.append(ids)
        flat = torch.cat(chosen).tolist()
        starts = np.cumsum([0, *active]).tolist()
        for i, job in enumerate(jobs):
            job.drafts = [flat[starts[s] + i] for s in range(job.k)]
            job.seq.tokens.extend(job.tokens[job.keep :])
            job.seq.tokens.extend(job.drafts[:-1])  # fed back, so their K/V is in the pool
            assert len(job.seq.tokens) == len(job.seq.slots)

    def _extend_batch(self, jobs: list[DraftJob], ints: dict[str, torch.Tensor]) -> ForwardBatch:
        return self.table.extend_batch(
            ints,
            tuple(len(j.tokens) for j in jobs),
            tuple(len(j.tokens) - j.keep for j in jobs),
        )

    def _catch_up(
        self, jobs: list[DraftJob], steps: int, ints: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The extend as `steps` one-token decode batches (CUDA graphs), right-aligned: the
        last one holds every job in order, and its logits are the extend's."""
        for i in range(steps):
            members = catch_up_members(jobs, steps, i)
            lens = [len(jobs[r].tokens) - steps + i + 1 for r in members]
            logits = self._forward(
                self.table.one_token_batch(
                    ints[f"cids{i}"],
                    ints[f"cpos{i}"],
                    ints[f"cloc{i}"],
                    ints[f"crows{i}"],
                    ints[f"clens{i}"],
                    lens,
                )
            )
        return logits

    def _decode_batch(
        self, ids: torch.Tensor, jobs: list[DraftJob], s: int, ints: dict[str, torch.Tensor]
    ) -> ForwardBatch:
        return self.table.one_token_batch(
            ids,
            ints[f"pos{s}"],
            ints[f"loc{s}"],
            ints["rows"][: len(jobs)],
            ints[f"lens{s}"],
            [len(j.tokens) + s for j in jobs],
        )

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.graphs is not None:
            logits = self.graphs.maybe_run(batch, self.kv)  # None: not a decode-only batch
            if logits is not None:
                return logits
        return self.model(batch, self.kv)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two lists (slice compares run in C)."""
    m = min(len(a), len(b))
    if a[:m] == b[:m]:
        return m
    lo, hi = 0, m  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def check_vocab(draft_vocab: int, target_vocab: int) -> None:
    if draft_vocab != target_vocab:
        raise ValueError(
            f"the draft model's vocabulary has {draft_vocab} tokens but the "
            f"target's {target_vocab}: a draft must use the target's tokenizer "
            "(pick a draft of the same model family)"
        )


def _checked_tokens(inp: ProposalInput) -> list[int]:
    if not isinstance(inp, ProposalInput):
        raise TypeError(f"propose() takes ProposalInput objects, got {type(inp).__name__}")
    if (
        isinstance(inp.max_tokens, bool)
        or not isinstance(inp.max_tokens, int)
        or inp.max_tokens < 1
    ):
        raise ValueError(f"max_tokens must be an int >= 1, got {inp.max_tokens!r}")
    if inp.params is not None and not isinstance(inp.params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams or None, got {type(inp.params).__name__}")
    tokens = list(inp.token_ids)
    if not tokens:
        raise ValueError("token_ids must not be empty")
    return tokens


def _draft_seed(seed: int) -> int:
    """A seed for the draft's own RNG: derived from the request's, but not equal to it, so
    the draft's draws are not the target's acceptance draws."""
    return (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (1 << 63)


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")


def prepare_and_run(
    inputs: Sequence[ProposalInput],
    prepare: Callable[[ProposalInput, set[Hashable]], Any],
    run: Callable[[list[Any]], None],
    unwind: Callable[[Any], None],
) -> list[Any]:
    """A drafting proposer's call: a job per input (None: nothing to draft), the live ones run
    together, longest first; on any failure every job prepared is unwound, then it raises."""
    protect = {inp.rid for inp in inputs}
    if len(protect) != len(inputs):
        raise ValueError("propose() takes each request at most once")
    jobs: list[Any] = []
    try:
        for inp in inputs:
            jobs.append(prepare(inp, protect))
        live = sorted((j for j in jobs if j is not None), key=lambda j: -j.k)
        if live:
            with torch.inference_mode():
                run(live)
    except BaseException:
        for job in jobs:
            if job is not None:
                unwind(job)
        raise
    return jobs
