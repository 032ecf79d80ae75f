"""Verification in the hybrid batch without a model: the Scheduler plans verify entries,
StepOutputs accepts chains from hand-made logits (a deterministic function of the fed
sequence), process_results frees rejected drafts' KV. Speculation must not change outputs,
also when the drafts follow tokens a jump-forward forced (one verify entry for both)."""

from __future__ import annotations

import pytest
import torch

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.fsm.jump import JumpResult
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine.step_outputs import StepOutputs
from lmprog.runtime.request import Req, ReqOutputs, ReqStatus
from lmprog.runtime.scheduler import Scheduler

torch.set_num_threads(1)
V = 32
EOS = (0,)


def row_for(seq) -> torch.Tensor:
    """The 'model': next-token logits of a sequence (random, but a function of it)."""
    g = torch.Generator().manual_seed(hash(tuple(seq)) % (1 << 31))
    return torch.randn(V, generator=g) * 3


def logits_for(batch) -> torch.Tensor:
    rows = []
    for e in batch.entries:
        if e.logits_from is None:
            continue
        fed = e.req.token_ids[: e.end - e.num_draft] + list(e.draft_ids)
        rows += [row_for(fed[: p + 1]) for p in range(e.logits_from, e.end)]
    return torch.stack(rows) if rows else torch.empty(0, V)


def forced_after(output_ids) -> tuple[int, ...]:
    """The toy constraint's forced text: 4 tokens, a function of the output so far."""
    return tuple((output_ids[-1] * 7 + 3 * i) % (V - 1) + 1 for i in range(4))


class ForcingState(DecodeState):
    """A DecodeState whose toy constraint forces `forced_after(output)` once the output has
    one of the lengths in `at`: jump-forward as DecodeState.accept applies it (bounded by
    max_tokens and room), without a guide or tokenizer."""

    def __init__(self, *args, at=(), **kw):
        super().__init__(*args, **kw)
        self.at, self.jump = frozenset(at), True

    def _jump_forward(self, room):
        n = len(self.output_ids)
        budget = self.params.max_tokens - n
        if room is not None:
            budget = min(budget, room)
        new = forced_after(self.output_ids)[: max(0, budget)] if n in self.at else ()
        if not new:
            return None
        self.output_ids.extend(new)
        if self.counts is not None:
            for t in new:
                self.counts[t] += 1
        return JumpResult(0, new)


class Harness:
    """Scheduler + StepOutputs as the engine drives them; drafts from `drafts(req)`."""

    def __init__(self, drafts=None, slots=512, budget=64, max_reqs=8, page_size=1, **sched):
        self.s = Scheduler(
            slots,
            256,
            SchedulerConfig(max_num_batched_tokens=budget, max_running_requests=max_reqs, **sched),
            CacheConfig(page_size=page_size),
        )
        self.out = StepOutputs(BatchSampler(EOS))
        self.drafts = drafts
        self.accepted = self.rejected = 0
        self.jump_verifies = 0  # verify entries whose drafts followed forced tokens

    def submit(self, rid, prompt, params, at=()):
        req = Req(rid, prompt, params)
        req.engine_data = ForcingState(
            params,
            tokenizer=None,
            prompt_ids=prompt,
            eos_token_ids=EOS,
            vocab_size=V,
            token_text=str,
            at=at,
            outputs=ReqOutputs(req),
        )
        return self.s.submit(req)

    def schedule(self):
        if self.drafts is not None:
            for r in self.s.decoding():
                r.draft_ids = list(self.drafts(r))
        return self.s.schedule()

    def step(self):
        batch = self.schedule()
        res = self.out.process(batch, logits_for(batch))
        return batch, res, self.record(batch, res)

    def record(self, batch, res):
        """process_results of a processed step; the finished."""
        self.accepted += res.num_accepted
        self.rejected += sum(res.rejected)
        self.jump_verifies += sum(e.num_new > e.num_draft + 1 for e in batch.entries if e.draft_ids)
        finished = self.s.process_results(batch, res.reasons)
        self.s.check_integrity()
        for r in self.s.requests.running_reqs():  # no page of a rejected draft survives
            assert r.num_allocated == self.s.cache.round_up(r.num_computed)
            assert r.pending_len > 1 or r.draft_ids == []
        return finished

    def run(self):
        while self.s.has_work:
            self.step()


def plain_outputs(prompts, params, at=(), page_size=1):
    h = Harness(page_size=page_size)
    reqs = [h.submit(i, p, params, at) for i, p in enumerate(prompts)]
    h.run()
    return reqs


def oracle(reference, every=3):
    """Drafts the reference continuation, with one wrong token in every `every`-th call."""
    calls = [0]

    def drafts(req):
        ref = reference[req.rid].engine_data.output_ids
        done = req.output_len
        chain = list(ref[done : done + 4])
        calls[0] += 1
        if chain and calls[0] % every == 0:
            chain[min(2, len(chain) - 1)] = (chain[min(2, len(chain) - 1)] + 1) % V
        return chain

    return drafts


PROMPTS = [[3, 4, 5], [7, 8], [9, 10, 11, 12, 13], [5, 4, 3, 2]]


def outputs(reqs):
    return [r.engine_data.output_ids for r in reqs]


@pytest.mark.parametrize(
    "params",
    [
        SP(max_tokens=20, temperature=0.0, ignore_eos=True),
        SP(max_tokens=20, temperature=0.9, top_k=8, seed=5, ignore_eos=True),  # seeded sampling
        SP(max_tokens=16, temperature=0.0, frequency_penalty=1.5, min_tokens=6),  # EOS is token 0
    ],
    ids=["greedy", "seeded-sampling", "penalty-min-tokens"],
)
def test_speculation_reproduces_plain_decoding(params):
    ref = plain_outputs(PROMPTS, params)
    h = Harness(oracle({r.rid: r for r in ref}))
    reqs = [h.submit(i, p, params) for i, p in enumerate(PROMPTS)]
    h.run()
    assert outputs(reqs) == outputs(ref)
    assert [r.engine_data.finish_reason for r in reqs] == [r.engine_data.finish_reason for r in ref]
    assert h.accepted > 10 and h.rejected > 0


def test_one_verify_step_accepts_a_prefix_and_frees_the_rest():
    h = Harness()
    r = h.submit("a", [3, 4, 5], SP(max_tokens=10, temperature=0.0, ignore_eos=True))
    h.step()  # prefill -> first token
    truth = [r.token_ids[-1]]
    seq = list(r.token_ids)
    for _ in range(3):
        nxt = int(row_for(seq).argmax())
        seq.append(nxt)
        truth.append(nxt)
    free = h.s.cache.allocator.num_free
    r.draft_ids = [truth[1], (truth[2] + 1) % V, 17]
    batch = h.s.schedule()
    (e,) = batch.entries
    assert (e.num_new, e.logits_from, e.num_draft) == (4, e.start, 3)
    assert h.s.cache.allocator.num_free == free - 4
    res = h.out.process(batch, logits_for(batch))
    assert res.tokens == [(truth[1], truth[2])] and res.accepted == [1] and res.rejected == [True]
    h.s.process_results(batch, res.reasons)
    h.s.check_integrity()
    assert r.output_ids == truth[:3] and r.num_computed == r.seq_len - 1
    assert h.s.cache.allocator.num_free == free - 2  # pending token + one accepted draft


def test_fully_accepted_chain_gets_the_bonus_token():
    h = Harness()
    r = h.submit("a", [1, 2], SP(max_tokens=10, temperature=0.0, ignore_eos=True))
    h.step()
    seq, drafts = list(r.token_ids), []
    for _ in range(4):
        drafts.append(int(row_for(seq).argmax()))
        seq.append(drafts[-1])
    bonus = drafts.pop()
    r.draft_ids = list(drafts)
    batch = h.s.schedule()
    res = h.out.process(batch, logits_for(batch))
    assert res.tokens == [tuple(drafts) + (bonus,)] and res.accepted == [3]
    assert res.rejected == [False] and res.num_sampled == 4


def test_stop_token_inside_an_accepted_chain_ends_exactly_there():
    params = SP(max_tokens=20, temperature=0.0, ignore_eos=True)
    ref = plain_outputs(PROMPTS[:1], params)[0].engine_data.output_ids
    stop = SP(max_tokens=20, temperature=0.0, ignore_eos=True, stop_token_ids=(ref[5],))
    cut = ref.index(ref[5])
    h = Harness(lambda r: ref[r.output_len : r.output_len + 6])  # always the whole truth
    r = h.submit("a", PROMPTS[0], stop)
    h.run()
    state = r.engine_data
    assert state.output_ids == ref[: cut + 1] and state.finish_reason == "stop"
    assert state.matched_stop == ref[5] and r.status is ReqStatus.FINISHED
    cache = h.s.cache
    assert cache.allocator.num_free + cache.prefix_cache.evictable_size == cache.capacity


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7])
def test_max_tokens_is_exact(max_tokens):
    params = SP(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ref = plain_outputs(PROMPTS[:1], SP(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    truth = ref.engine_data.output_ids
    h = Harness(lambda r: truth[r.output_len : r.output_len + 8])
    r = h.submit("a", PROMPTS[0], params)
    h.run()
    assert r.engine_data.output_ids == truth[:max_tokens]
    assert r.engine_data.finish_reason == "length"


def test_logprobs_of_every_accepted_token():
    params = SP(
        max_tokens=12, temperature=0.0, ignore_eos=True, return_logprob=True, top_logprobs_num=2
    )
    ref = plain_outputs(PROMPTS[:1], params)[0]
    h = Harness(oracle({"a": ref}, every=2))
    r = h.submit("a", PROMPTS[0], params)
    h.run()
    lps = r.engine_data.logprobs
    assert [lp.token_id for lp in lps] == r.engine_data.output_ids == ref.engine_data.output_ids
    seq = list(PROMPTS[0])
    for lp in lps:
        raw = torch.log_softmax(row_for(seq), -1)
        assert lp.logprob == pytest.approx(float(raw[lp.token_id]), abs=1e-5)
        assert [t.token_id for t in lp.top] == raw.topk(2).indices.tolist()
        seq.append(lp.token_id)
    assert h.accepted > 3


@pytest.mark.parametrize("at", [(), (3, 11, 19)], ids=["plain", "forced-tokens"])
def test_retraction_and_abort_of_speculating_requests_leave_no_trace(at):
    params = SP(max_tokens=30, temperature=0.0, ignore_eos=True)
    prompts = [[i, i + 1, i + 2] for i in range(1, 9)]
    ref = plain_outputs(prompts, params, at)
    h = Harness(
        oracle({r.rid: r for r in ref}),
        slots=120,
        budget=40,
        init_new_token_ratio=0.01,
        min_new_token_ratio=0.01,
    )
    reqs = [h.submit(i, p, params, at) for i, p in enumerate(prompts)]
    while True:
        batch = h.schedule()
        verifying = [e.req for e in batch.entries if e.draft_ids]
        if len(verifying) >= 2:
            break
        h.record(batch, h.out.process(batch, logits_for(batch)))
    victim = verifying[-1]  # aborted mid-step, while its verify entry is in flight
    h.s.abort(victim.rid)
    h.record(batch, h.out.process(batch, logits_for(batch)))
    assert victim.status is ReqStatus.FINISHED and victim.num_allocated == 0
    h.run()
    assert h.s.num_retractions > 0 and (h.jump_verifies > 0) == bool(at)
    for r, want in zip(reqs, ref):
        if r is not victim:
            assert r.engine_data.output_ids == want.engine_data.output_ids
    cache = h.s.cache
    assert cache.allocator.num_free + cache.prefix_cache.evictable_size == cache.capacity
    h.s.flush_cache()
    assert cache.allocator.num_free == cache.capacity


# ---- drafts after jump-forward tokens ---------------------------------------------------------
def greedy_after(seq, n):
    """The 'model's greedy continuation of seq, n tokens."""
    seq, out = list(seq), []
    for _ in range(n):
        out.append(int(row_for(seq).argmax()))
        seq.append(out[-1])
    return out


def test_forced_tokens_and_drafts_share_one_verify_entry():
    h = Harness()
    r = h.submit("a", [3, 4, 5], SP(max_tokens=20, temperature=0.0, ignore_eos=True))
    h.step()  # prefill -> first token
    first = r.token_ids[-1]
    forced = [7, 9, 11, 13]
    r.engine_data.output_ids.extend(forced)  # a jump-forward's tokens, in the request
    assert h.s.decoding() == [r] and r.pending_len == 5
    truth = greedy_after(r.token_ids, 3)
    r.draft_ids = [truth[0], truth[1], (truth[2] + 1) % V]
    free = h.s.cache.allocator.num_free
    batch = h.s.schedule()
    (e,) = batch.entries
    assert (e.num_new, e.num_draft, e.logits_from, e.sample) == (8, 3, e.end - 4, True)
    assert e.input_ids() == [first] + forced + r.draft_ids
    assert h.s.cache.allocator.num_free == free - 8
    res = h.out.process(batch, logits_for(batch))  # 4 rows: after 13, d0, d1, d2
    assert res.tokens == [tuple(truth)] and res.accepted == [2] and res.rejected == [True]
    h.s.process_results(batch, res.reasons)
    h.s.check_integrity()
    assert r.output_ids == [first] + forced + truth and r.num_computed == r.seq_len - 1
    assert h.s.cache.allocator.num_free == free - 7  # the tail and two accepted drafts
    # a fully accepted chain after forced tokens ends with the bonus token
    r.engine_data.output_ids.extend(forced)
    chain = greedy_after(r.token_ids, 4)
    r.draft_ids = chain[:3]
    batch = h.s.schedule()
    res = h.out.process(batch, logits_for(batch))
    assert res.tokens == [tuple(chain)] and res.accepted == [3] and res.rejected == [False]
    h.s.process_results(batch, res.reasons)
    h.s.check_integrity()
    assert r.num_computed == r.num_allocated == r.seq_len - 1


@pytest.mark.parametrize(
    "params",
    [
        SP(max_tokens=24, temperature=0.0, ignore_eos=True),
        SP(max_tokens=24, temperature=0.9, top_k=8, seed=7, ignore_eos=True),
        SP(max_tokens=18, temperature=0.0, frequency_penalty=1.5, min_tokens=6),
    ],
    ids=["greedy", "seeded-sampling", "penalty-min-tokens"],
)
@pytest.mark.parametrize("page_size", [1, 4])
def test_drafts_after_forced_tokens_reproduce_plain_decoding(params, page_size):
    at = (2, 9, 15)  # output lengths after which the toy constraint forces 4 tokens
    ref = plain_outputs(PROMPTS, params, at, page_size)
    h = Harness(oracle({r.rid: r for r in ref}), page_size=page_size)
    reqs = [h.submit(i, p, params, at) for i, p in enumerate(PROMPTS)]
    h.run()
    assert outputs(reqs) == outputs(ref)
    assert [r.engine_data.finish_reason for r in reqs] == [r.engine_data.finish_reason for r in ref]
    assert h.jump_verifies >= len(PROMPTS) and h.accepted > 10 and h.rejected > 0


def test_forced_tails_take_drafts_only_within_the_budget():
    h = Harness(budget=8)
    r = h.submit("a", [3, 4, 5], SP(max_tokens=40, temperature=0.0, ignore_eos=True))
    h.step()

    def step_with_drafts(forced, drafts):
        r.engine_data.output_ids.extend(forced)
        r.draft_ids = list(drafts)
        batch = h.s.schedule()
        res = h.out.process(batch, logits_for(batch))
        h.s.process_results(batch, res.reasons)
        h.s.check_integrity()
        return batch.entries[0]

    e = step_with_drafts([7, 9, 11, 13], [1, 2, 3, 4, 5])  # 5 pending: room for 3 drafts
    assert (e.num_new, e.draft_ids, e.sample) == (8, (1, 2, 3), True)
    # a tail as long as the budget is no decoding request: fed in chunks, drafts dropped
    r.engine_data.output_ids.extend(range(20, 28))
    assert r.pending_len == 9 and h.s.decoding() == []
    e = step_with_drafts([], [1, 2])
    assert (e.num_new, e.draft_ids, e.sample) == (8, (), False)
    assert r.pending_len == 1 and r.draft_ids == [] and h.s.decoding() == [r]
