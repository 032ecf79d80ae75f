"""How many draft tokens each speculating request gets this step. Plain arithmetic, no torch.

Each request's draft length maximises E(k) / (1 + c k) from its estimated acceptance rate
(c: one draft's cost), with back-off in time for requests whose drafts do not pay and a
batch cap (max_step_tokens). adaptive=False: num_tokens every step.
The rule in full: docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Sequence

PRIOR_RATE = 0.6
PRIOR_WEIGHT = 1.0
DECAY = 0.85
MAX_WAIT = 16
PROBE_SHARE = 8  # at most one probe per this many candidates in a step (at least one)
FRESH_PROBE_EVERY = 64  # steps between probes of requests without verifies, where costly
PROPOSE_WEIGHT = 0.2  # the newest step's weight in the proposing-cost estimate
MAX_PROPOSE_COST = 1.0  # a draft costing a whole step is never worth it (k = 0 for a < 1)


class AcceptanceRate:
    """One request's acceptance statistics and back-off (docs/design/speculative.md,
    steps 1 and 3)."""

    __slots__ = ("accepted", "cut", "wait", "penalty", "pool")

    def __init__(self, pool: AcceptanceRate | None = None) -> None:
        """pool: the pooled statistics of every request (see pooled_rate)."""
        self.accepted = 0.0  # draft tokens accepted (decayed)
        self.cut = 0.0  # chains that ended in a rejected draft (decayed)
        self.wait = 0  # decode steps to go before the proposer is asked again
        self.penalty = 0  # the current wait length; 0 when not backing off
        self.pool = pool

    @property
    def rate(self) -> float:
        prior_acc = PRIOR_RATE * PRIOR_WEIGHT
        return (self.accepted + prior_acc) / (self.accepted + self.cut + PRIOR_WEIGHT)

    @property
    def pooled_rate(self) -> float:
        """The pool's rate while this one has no verify, else its own."""
        return self.pool.rate if self.pool is not None and self.fresh else self.rate

    @property
    def fresh(self) -> bool:
        """No verify seen yet."""
        return self.accepted == 0.0 and self.cut == 0.0

    def update(self, accepted: int, rejected: bool) -> None:
        """A verify of this request: `accepted` drafts taken, then a rejection or not."""
        self.accepted = DECAY * self.accepted + accepted
        self.cut = DECAY * self.cut + (1.0 if rejected else 0.0)
        if accepted:
            self.penalty = 0

    def ready(self) -> bool:
        """Whether the proposer may be asked this step (counts a wait down)."""
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def length(self, best: int, may_probe: bool = True) -> int:
        """The drafts to ask for when ready, given the rate's best length: that, or at
        k = 0 nothing at first and then a one-draft probe after each (doubling) wait
        (when `may_probe`; otherwise the wait doubles as if it had probed)."""
        if best > 0:
            return best
        probe = self.penalty > 0 and may_probe
        self._back_off()
        return 1 if probe else 0

    def proposed(self, empty: bool) -> None:
        """The proposer answered; an empty proposal starts (or doubles) a wait."""
        if empty:
            self._back_off()

    def _back_off(self) -> None:
        self.penalty = min(MAX_WAIT, max(1, 2 * self.penalty))
        self.wait = self.penalty


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a verify with k drafts yields on average: 1 + a + ... + a^k."""
    return sum(rate**j for j in range(k + 1))


def best_length(rate: float, max_tokens: int, cost: float) -> int:
    """argmax over k in [0, max_tokens] of E(k) / (1 + cost * k); the shortest on ties."""
    best_k, best = 0, 1.0
    term, total = 1.0, 1.0
    for k in range(1, max_tokens + 1):
        term *= rate
        total += term
        value = total / (1.0 + cost * k)
        if value > best + 1e-12:
            best_k, best = k, value
    return best_k


class ProposeCost:
    """The measured cost of proposing one draft position relative to a step without
    proposing (docs/design/speculative.md, step 2): a draft model runs one forward per
    position of the longest chain asked, for the whole batch, so a step that took step_s seconds,
    propose_s of them proposing chains of at most `longest` drafts, gives the sample
    propose_s / (longest * (step_s - propose_s)). The estimate is their mean over the first
    steps, then an exponentially weighted mean (weight PROPOSE_WEIGHT)."""

    __slots__ = ("value", "samples")

    def __init__(self) -> None:
        self.value = 0.0  # the estimate (0 until a step was observed)
        self.samples = 0

    def observe(self, propose_s: float, step_s: float, longest: int) -> None:
        """One step that asked the proposer (durations in seconds)."""
        assert longest >= 1 and propose_s >= 0, (propose_s, longest)
        rest = step_s - propose_s
        if rest <= 0:  # a clock that did not advance: nothing learnt
            return
        sample = min(MAX_PROPOSE_COST, propose_s / (longest * rest))
        self.samples += 1
        self.value += max(PROPOSE_WEIGHT, 1.0 / self.samples) * (sample - self.value)


class DraftLengths:
    """Chooses the per-request draft lengths of a step (docs/design/speculative.md, steps 2-4).
    `cost` (c of step 2) may be updated between steps (the Speculator adds the measured
    proposing cost to draft_cost, and sets `cost_known` once it has measured some)."""

    def __init__(
        self, num_tokens: int, draft_cost: float, max_step_tokens: int, adaptive: bool = True
    ) -> None:
        assert num_tokens >= 1 and max_step_tokens >= 1 and 0 <= draft_cost <= 1
        self.num_tokens, self.cost = num_tokens, draft_cost
        self.verify_cost = draft_cost  # cost's part that verifying is (constant)
        self.cost_known = True  # False while a measured proposing cost has no sample yet
        self._fresh_wait = 0  # steps until a request without verifies may probe (costly)
        self.max_step_tokens, self.adaptive = max_step_tokens, adaptive

    def spare(self, num_fed: int) -> int:
        """Draft tokens the step has room for (adaptive only; else unbounded here), when
        the decoding requests feed num_fed tokens before drafts."""
        if not self.adaptive:
            return self.num_tokens * num_fed
        return max(0, self.max_step_tokens - num_fed)

    def choose(
        self, stats: Sequence[AcceptanceRate], caps: Sequence[int], num_fed: int
    ) -> list[int]:
        """Draft lengths for requests with statistics `stats` that may still take `caps`
        drafts; num_fed: the tokens every decoding request of the step feeds before its
        drafts (1 each, plus jump-forward tokens), speculating or not. Mutates the back-off
        state of `stats` (asked or not this step)."""
        assert len(stats) == len(caps)
        if not self.adaptive:
            return [max(0, min(self.num_tokens, c)) for c in caps]
        spare = self.spare(num_fed)
        if spare <= 0:
            return [0] * len(caps)
        ks = [0] * len(caps)
        # proposing known to cost at most what verifying does (an n-gram lookup): every
        # request learns for itself; else (a draft model, or not measured yet) see step 3
        cheap = self.cost_known and self.cost <= 2 * self.verify_cost
        rationed = max(1, len(caps) // PROBE_SHARE)
        probes = len(caps) if cheap else rationed
        newcomers = len(caps) if cheap or len(caps) <= PROBE_SHARE else rationed
        self._fresh_wait = max(0, self._fresh_wait - 1)
        for i, (st, cap) in enumerate(zip(stats, caps)):
            unproven = st.fresh and st.pool is not None and st.pool.fresh
            if unproven and newcomers <= 0:
                continue  # asked in a later step, once the pool has seen some verifies
            if st.ready():
                rate = st.rate if cheap else st.pooled_rate
                best = best_length(rate, self.num_tokens, self.cost)
                may_probe = probes > 0 and (cheap or not st.fresh or self._fresh_wait == 0)
                ks[i] = max(0, min(st.length(best, may_probe), cap))
                probed = best == 0 and ks[i] > 0
                probes -= probed
                newcomers -= unproven and ks[i] > 0
                if probed and st.fresh and not cheap:
                    self._fresh_wait = FRESH_PROBE_EVERY
        if sum(ks) <= spare:
            return ks
        return _most_likely([st.rate for st in stats], ks, spare)


def _most_likely(rates: Sequence[float], ks: Sequence[int], room: int) -> list[int]:
    """Shrink ks to `room` drafts in total, keeping those most likely accepted (a_r^j); ties
    go to earlier chain positions, then earlier requests. Each request keeps a prefix of its
    chain (a_r^j does not grow with j)."""
    ranked = sorted(
        ((rates[r] ** j, -j, -r) for r, k in enumerate(ks) for j in range(1, k + 1)), reverse=True
    )
    out = [0] * len(ks)
    for _, _, neg_r in ranked[:room]:
        out[-neg_r] += 1
    return out
