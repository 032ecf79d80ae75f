"""The data-parallel router and replica group, torch-free: the approximate radix tree against
a brute-force reference, the routing policy, and ReplicaGroup over fake engines (load
counting, pins, dead replicas, aggregated stats)."""

from __future__ import annotations

import random

import pytest

from lmprog.core.errors import BackendError, ContextLengthError
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.data_parallel.replicas import ReplicaGroup, memory_fraction, replica_devices
from lmprog.runtime.data_parallel.router import ApproxTree, Router, RouterConfig
from lmprog.runtime.engine.io import EngineRequest

HEAD = list(range(100, 132))  # a 32-token shared head


def shared(i: int, tail: int = 4) -> list[int]:
    return HEAD + [1000 + 10 * i + j for j in range(tail)]


def unrelated(i: int, n: int = 12) -> list[int]:
    return [5000 + 100 * i + j for j in range(n)]


# ---- the tree ------------------------------------------------------------------------------
def test_tree_matches_the_longest_common_prefix_of_what_was_inserted():
    rng = random.Random(0)
    tree, seen = ApproxTree(), []
    for _ in range(300):
        base = rng.choice(seen) if seen and rng.random() < 0.7 else []
        cut = rng.randint(0, len(base))
        seq = base[:cut] + [rng.randrange(6) for _ in range(rng.randint(1, 8))]
        query = base[:cut] + [rng.randrange(6) for _ in range(rng.randint(0, 8))]
        expect = max((_lcp(query, s) for s in seen), default=0)
        assert tree.match(query)[0] == expect
        tree.insert(seq)
        seen.append(seq)
    assert tree.size == len(_prefixes(seen))  # every distinct prefix is one token on an edge


def test_tree_splits_edges_and_keeps_pins_at_the_prefix_end():
    tree = ApproxTree()
    tree.insert([1, 2, 3, 4], pin=True)
    tree.insert([1, 2, 5])  # splits [1, 2, 3, 4] after two tokens
    assert tree.size == 5
    assert tree.match([1, 2, 3, 4, 9]) == (4, 4)
    assert tree.match([1, 2, 5, 6]) == (3, 0)
    assert tree.match([1, 2]) == (2, 0)  # inside the pinned prefix: not pinned
    assert tree.match([7]) == (0, 0)


def test_tree_is_bounded_and_drops_the_least_recently_used_first():
    tree = ApproxTree(max_tokens=100)
    for i in range(30):
        tree.insert(unrelated(i, 10))
        tree.insert(unrelated(0, 10))  # keep the first one in use
        assert tree.size <= 100
    assert tree.match(unrelated(0, 10))[0] == 10
    assert tree.match(unrelated(29, 10))[0] == 10
    assert tree.match(unrelated(1, 10))[0] == 0  # the oldest went


# ---- the policy ----------------------------------------------------------------------------
def test_shared_prefix_requests_go_to_one_replica_unrelated_ones_are_balanced():
    router = Router(2)
    homes = {router.route(shared(i), [0, 0]).replica for i in range(8)}
    assert len(homes) == 1
    home = homes.pop()
    others = [router.route(unrelated(i, 40), [0, 0]).replica for i in range(8)]
    assert 0 < others.count(home) < 4  # unrelated: the smaller tree, so tokens even out
    sizes = [r["tree_tokens"] for r in router.stats()]
    assert abs(sizes[0] - sizes[1]) <= 40 and sum(sizes) == 64 + 8 * 40
    assert router.stats()[home]["routed"]["prefix"] == 7


def test_concurrent_unrelated_requests_go_to_the_least_loaded():
    router = Router(3)
    loads = [0, 0, 0]
    for i in range(9):
        loads[router.route(unrelated(i), loads).replica] += 1
    assert loads == [3, 3, 3]


def test_a_pinned_prefix_draws_its_children_whatever_their_match_ratio():
    router = Router(2)
    prefix = HEAD[:8]
    home = router.route(prefix, [0, 0], pin=True).replica
    child = prefix + list(range(7000, 7100))  # 8 of 108 tokens: below cache_threshold
    d = router.route(child, [3, 0] if home == 0 else [0, 3])
    assert (d.replica, d.reason, d.matched) == (home, "pinned", 8)
    plain = Router(2)  # the same without the pin: the least-loaded replica
    plain.route(prefix, [0, 0])
    assert plain.route(child, [3, 0]).reason == "least_loaded"


def test_imbalance_overrides_the_prefix_and_the_pin():
    router = Router(2, RouterConfig(balance_abs_threshold=4, balance_rel_threshold=1.5))
    router.route(HEAD, [0, 0], pin=True)  # replica 0
    assert router.route(shared(1), [4, 0]).replica == 0  # 4 - 0 is not above 4
    d = router.route(shared(2), [5, 0])
    assert (d.replica, d.reason) == (1, "balance")
    assert router.route(shared(3), [9, 7]).replica == 0  # 9 < 7 * 1.5: not imbalanced


def test_dead_replicas_are_never_chosen_and_none_left_is_an_error():
    router = Router(2)
    home = router.route(HEAD, [0, 0], pin=True).replica
    router.mark_dead(home)
    assert router.route(shared(1), [0, 0]).replica == 1 - home
    router.mark_dead(1 - home)
    with pytest.raises(BackendError, match="every one of the 2 data-parallel replicas"):
        router.route(shared(2), [0, 0])


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="cache_threshold"):
        RouterConfig(cache_threshold=1.5)
    with pytest.raises(ValueError, match="balance_abs_threshold"):
        RouterConfig(balance_abs_threshold=-1)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        RouterConfig(balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="num_replicas"):
        Router(0)
    with pytest.raises(ValueError, match="loads"):
        Router(2).route([1], [0])


# ---- the group over fake engines -----------------------------------------------------------
class FakeHandle:
    def __init__(self, request):
        self.request, self.finished_at = request, None

    def finish(self):
        self.finished_at = 1.0


class FakeEngine:
    """An engine's surface: submit, stats, flush_cache, check_integrity, alive, shutdown."""

    def __init__(self, capacity=4096, max_prompt=1000):
        self.alive, self.handles, self.flushes = True, [], 0
        self.capacity, self.max_prompt, self.internal_errors = capacity, max_prompt, 0
        self.refuse = False  # a thread that ended after the group's alive check

    def submit(self, request, stream=True):
        if len(request.prompt_ids) > self.max_prompt:
            raise ContextLengthError("too long")
        if self.refuse or not self.alive:
            raise BackendError("the runtime engine is shut down; create a new Runtime")
        self.handles.append(FakeHandle(request))
        return self.handles[-1]

    def stats(self):
        running = sum(h.finished_at is None for h in self.handles)
        return {
            "kv_capacity": self.capacity,
            "num_running": running,
            "prompt_tokens": 10 * len(self.handles),
            "cached_tokens": 5 * len(self.handles),
            "generated_tokens": 3 * len(self.handles),
            "gen_tokens_per_s": 100.0,
            "internal_errors": self.internal_errors,
            "requests_finished": {"stop": len(self.handles) - running},
            "eviction": "lru",
        }

    def flush_cache(self):
        self.flushes += 1
        return True

    def check_integrity(self):
        pass

    def shutdown(self, timeout=None):
        self.alive = False


def req(tokens, max_tokens=4):
    return EngineRequest(tuple(tokens), SamplingParams(max_tokens=max_tokens))


def where(group, handle):
    return next(i for i, e in enumerate(group.replicas) if handle in e.handles)


def test_group_sends_a_fork_to_one_replica_and_spreads_unrelated_requests():
    group = ReplicaGroup([FakeEngine(), FakeEngine()])
    prefix = group.submit(req(HEAD, max_tokens=0))  # cache_prefix: prefill only, pins
    children = [
        group.submit(req(HEAD + list(range(2000 + 90 * i, 2090 + 90 * i)))) for i in range(8)
    ]
    assert {where(group, h) for h in [prefix, *children]} == {where(group, prefix)}
    assert group.loads() == ([9, 0] if where(group, prefix) == 0 else [0, 9])
    for h in [prefix, *children]:
        h.finish()
    assert group.loads() == [0, 0]
    spread = [where(group, group.submit(req(unrelated(i)))) for i in range(6)]
    assert sorted(spread) == [0, 0, 0, 1, 1, 1]


def test_group_balances_a_large_shared_prefix_batch_past_the_threshold():
    group = ReplicaGroup([FakeEngine(), FakeEngine()], RouterConfig(balance_abs_threshold=4))
    group.submit(req(HEAD, max_tokens=0)).finish()
    handles = [group.submit(req(shared(i))) for i in range(20)]
    counts = group.loads()
    assert sum(counts) == 20 and min(counts) >= 7  # kept within the threshold
    assert group.stats()["replicas"][1]["routed"]["balance"] >= 7
    assert len(handles) == 20


def test_a_dead_replica_gets_no_requests_and_the_others_serve_on(caplog):
    a, b = FakeEngine(), FakeEngine()
    group = ReplicaGroup([a, b])
    first = group.submit(req(HEAD, max_tokens=0))
    home, other = (a, b) if first in a.handles else (b, a)
    home.alive = False  # its thread ended (the engine fails its pending requests itself)
    with caplog.at_level("WARNING", logger="lmprog.runtime.data_parallel.replicas"):
        later = [group.submit(req(shared(i))) for i in range(4)]
    assert all(h in other.handles for h in later)
    assert "stopped" in caplog.text and group.alive
    stats = group.stats()
    assert (
        stats["replicas_alive"] == 1 and not stats["replicas"][group.replicas.index(home)]["alive"]
    )
    routed = [sum(r["routed"].values()) for r in group.router.stats()]
    other.refuse = True  # dies between the alive check and its submit
    with pytest.raises(BackendError, match="every one of the 2 data-parallel replicas"):
        group.submit(req(shared(9)))
    assert not group.alive
    assert [sum(r["routed"].values()) for r in group.router.stats()] == routed  # not counted


def test_a_request_refused_for_its_length_is_not_recorded_or_rerouted():
    group = ReplicaGroup([FakeEngine(max_prompt=10), FakeEngine(max_prompt=10)])
    with pytest.raises(ContextLengthError):
        group.submit(req(range(50)))
    assert group.loads() == [0, 0]
    for replica in group.router.stats():
        assert replica["alive"] and replica["tree_tokens"] == 0
        assert sum(replica["routed"].values()) == 0


def test_flush_and_engine_resets_empty_the_router_trees():
    a, b = FakeEngine(), FakeEngine()
    group = ReplicaGroup([a, b])
    group.submit(req(HEAD)).finish()
    assert sum(r["tree_tokens"] for r in group.router.stats()) == len(HEAD)
    assert group.flush_cache() and a.flushes == b.flushes == 1
    assert sum(r["tree_tokens"] for r in group.router.stats()) == 0
    assert where(group, group.submit(req(HEAD))) == 0
    a.internal_errors += 1  # the engine reset after an internal error: its cache is empty
    assert where(group, group.submit(req(unrelated(1)))) == 1  # replica 0 has one running
    assert [r["tree_tokens"] for r in group.router.stats()] == [0, 12]


def test_group_stats_sum_the_replicas_and_keep_each_one():
    group = ReplicaGroup([FakeEngine(capacity=100), FakeEngine(capacity=300)], devices=["cpu"] * 2)
    for i in range(4):
        group.submit(req(unrelated(i)))
    group.replicas[0].handles[0].finish()
    s = group.stats()
    assert s["dp_size"] == 2 and s["kv_capacity"] == 400 and s["num_running"] == 3
    assert s["prompt_tokens"] == 40 and s["cache_hit_rate"] == 0.5
    assert s["gen_tokens_per_s"] == 200.0 and s["requests_finished"] == {"stop": 1}
    assert s["eviction"] == "lru"
    assert [r["load"] for r in s["replicas"]] == [1, 2]
    assert [r["device"] for r in s["replicas"]] == ["cpu", "cpu"]
    assert sum(r["routed"]["least_loaded"] for r in s["replicas"]) == 4
    group.shutdown()
    assert not group.alive
    with pytest.raises(BackendError, match="shut down"):
        group.submit(req(HEAD))


def test_replica_placement_and_memory_split():
    assert replica_devices(3, "cpu", "cpu", 0) == ["cpu"] * 3
    assert replica_devices(3, "auto", "cuda:0", 2) == ["cuda:0", "cuda:1", "cuda:0"]
    assert replica_devices(2, "cuda:1", "cuda:1", 4) == ["cuda:1"] * 2
    assert replica_devices(2, "auto", "cuda:0", 1) == ["cuda:0"] * 2
    free, total = 1.0, 0.85
    for j in range(3):  # each of three replicas on one GPU ends up with the same KV budget
        got = free * memory_fraction(j, 3, total)
        assert got == pytest.approx(total / 3)
        free -= got


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _prefixes(seqs):
    return {tuple(s[:k]) for s in seqs for k in range(1, len(s) + 1)}


def test_capacity_aware_groups_give_the_faster_replica_more():
    """RouterConfig(capacity_aware=True): unlike replicas (one three times as fast) share
    unrelated requests by expected completion time once each has measured its capacity."""

    class Speed(FakeEngine):
        def __init__(self, rate):
            super().__init__()
            self.rate = rate

        def stats(self):
            return {**super().stats(), "generated_tokens": 1000, "gen_tokens_per_s": self.rate}

    slow, fast = Speed(100.0), Speed(300.0)
    group = ReplicaGroup([slow, fast], RouterConfig(capacity_aware=True))
    for i in range(8):
        group.submit(req(unrelated(i)))
    assert (len(slow.handles), len(fast.handles)) == (2, 6)
    assert group.stats()["replicas"][1]["routed"]["capacity"] >= 5
    # not measured yet (too few tokens): the count rule
    fresh = ReplicaGroup([FakeEngine(), FakeEngine()], RouterConfig(capacity_aware=True))
    spread = [where(fresh, fresh.submit(req(unrelated(i)))) for i in range(4)]
    assert sorted(spread) == [0, 0, 1, 1]


class _Image:
    """What ImageRun reads of a prepared image: its digest and row count."""

    def __init__(self, digest: str, rows: int) -> None:
        self.digest, self.rows = digest, rows


def test_group_routes_images_by_their_content_not_their_image_tokens():
    from lmprog.runtime.images import ImageRun

    image_token, rows = 49152, 32
    ids = (1, 2, 3) + (image_token,) * rows + (4, 5)  # the same text around any image

    def ask(digest):
        run = ImageRun(_Image(digest, rows), list(range(3, 3 + rows)))
        return EngineRequest(ids, SamplingParams(max_tokens=4), images=(run,))

    group = ReplicaGroup([FakeEngine(), FakeEngine()])
    first = where(group, group.submit(ask("a" * 64)))
    # another image after the same text shares 3 tokens of 37: not a cached prefix there
    assert where(group, group.submit(ask("b" * 64))) == 1 - first
    # the first image again: its replica holds the whole prompt
    again = group.submit(ask("a" * 64))
    assert where(group, again) == first
    assert group.router.stats()[first]["routed"]["prefix"] == 1
