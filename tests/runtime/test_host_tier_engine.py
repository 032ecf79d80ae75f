"""The host KV tier through the engine (issue 34): multi-turn sessions whose KV is several
times the device pool give the same greedy tokens with the tier on and off, load returning
turns' prefixes from host memory (fewer prefill tokens), and survive a failed copy and an
abort while a request's blocks load, each counted; stats() and /metrics report the tier; a
disk tier under a small host tier, and its damaged files."""

from __future__ import annotations

import random

import pytest
from engine_testing import EOS, greedy, model, tok  # noqa: F401

from lmprog.core.errors import BackendError
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine

POOL = 200  # device KV slots; 6 sessions of up to ~90 tokens hold several times that
SESSIONS = 6


def make_engine(model, tok, host_bytes, page=1, overlap=False, staging=False, **disk):
    return launch_engine(
        model,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=POOL,
        cache_config=CacheConfig(
            page_size=page, host_kv_cache_bytes=host_bytes, host_kv_staging=staging, **disk
        ),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=128, max_running_requests=2),
        engine_config=EngineConfig(check_integrity=True, overlap=overlap),
    )


def sessions(engine, turns=3, n=SESSIONS, on_turn=None):
    """n sessions of `turns` turns, two at a time: every session returns after the n - 1
    others ran. Returns each request's outcome (tokens, or the exception's type)."""
    rng = random.Random(7)
    history = [[rng.randrange(3000, 9000) for _ in range(30)] for _ in range(n)]
    out = []
    for turn in range(turns):
        for first in range(0, n, 2):
            handles = []
            for i in (first, first + 1):
                handles.append(engine.submit(EngineRequest(tuple(history[i]), greedy(6))))
                if on_turn is not None:
                    on_turn(turn, i, handles[-1])
            for i, h in zip((first, first + 1), handles):
                result = h.result(timeout=120)
                out.append((result.finish_reason, result.token_ids))
                history[i] += list(result.token_ids) + [rng.randrange(3000, 9000) for _ in range(9)]
    return out


@pytest.fixture(scope="module")
def reference(model, tok):
    engine = make_engine(model, tok, 0)
    try:
        return sessions(engine), engine.stats()
    finally:
        engine.shutdown()


HOST_KEYS = {
    "host_kv_capacity_tokens",
    "host_kv_capacity_bytes",
    "host_kv_used_tokens",
    "host_kv_used_bytes",
    "host_kv_written_tokens",
    "host_kv_hit_tokens",
    "host_kv_evicted_tokens",
    "host_kv_dropped_tokens",
    "host_kv_load_misses",
    "host_kv_load_failures",
    "host_kv_partial_loads",
    "host_kv_short_tokens",
}


@pytest.mark.parametrize("page", [1, 4])
def test_returning_turns_load_from_the_host_with_the_same_tokens(model, tok, reference, page):
    want, off = reference
    assert not HOST_KEYS & set(off)
    from lmprog.serve.metrics import ServerMetrics

    engine = make_engine(model, tok, 1 << 20, page)
    try:
        got = sessions(engine)
        stats = engine.stats()
        text = ServerMetrics(engine.stats).render().decode()  # /metrics' text
    finally:
        engine.shutdown()
    assert got == want
    hits = stats["host_kv_hit_tokens"]
    assert f"lmprog_host_kv_cache_hit_tokens_total {float(hits)}" in text
    assert f"lmprog_host_kv_cache_used_bytes {float(stats['host_kv_used_bytes'])}" in text
    assert HOST_KEYS <= set(stats)
    assert stats["host_kv_hit_tokens"] > 200 and stats["host_kv_written_tokens"] > 0
    assert stats["cached_tokens"] > off["cached_tokens"] + 200
    assert stats["prefill_tokens"] < off["prefill_tokens"] - 200
    assert stats["host_kv_used_bytes"] == stats["host_kv_used_tokens"] * 2 * 2 * 2 * 16 * 4


def held_bytes(engine, folder=None):
    """The bytes of the host tier's tensors and disk tier's files, as allocated: (RAM,
    disk). A handle that is a view of a larger tensor counts its whole storage. folder:
    also the bytes of the block files in it as the file system has them (headers aside),
    read in the same engine call."""
    from lmprog.runtime.cache.hiradix import OnDisk

    def walk():
        cache = engine.scheduler.cache.prefix_cache
        if folder is not None:
            on_disk = sum(f.stat().st_size - 20 for f in folder.glob("lmprog-kv-*/*.blk"))
            return (*walk_tree(cache), on_disk)
        return walk_tree(cache)

    def walk_tree(cache):
        stack, held, files = [cache.root], 0, 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for child in (node.host_children or {}).values():
                stack.append(child)
                if isinstance(child.host, OnDisk):
                    files += child.host.block.ref.nbytes
                else:  # its tokens' rows, in the arena or a tensor of its own
                    buffer = child.host.buffer
                    held += child.host.n * buffer.element_size() * buffer[:, :1].numel()
        return held, files

    return engine.call(walk)


def test_a_small_host_tier_evicts_and_stays_exact(model, tok, reference):
    want, _ = reference
    per_token = 2 * 2 * 2 * 16 * 4  # layers, K and V, kv heads, head dim, fp32
    engine = make_engine(model, tok, 120 * per_token)
    try:
        got = sessions(engine)
        stats = engine.stats()
        ram, _ = held_bytes(engine)
    finally:
        engine.shutdown()
    assert ram == stats["host_kv_used_bytes"] <= 120 * per_token  # the memory really held
    assert got == want
    assert stats["host_kv_capacity_tokens"] == 120
    assert stats["host_kv_evicted_tokens"] + stats["host_kv_dropped_tokens"] > 0
    assert 0 < stats["host_kv_hit_tokens"] and stats["host_kv_used_tokens"] <= 120


def test_a_failed_load_is_recomputed_and_the_next_requests_load(model, tok, reference):
    want, _ = reference
    engine = make_engine(model, tok, 1 << 20)
    mover = engine.scheduler.cache._mover
    real_load, calls = mover.load, []

    def load(handle, slots, ahead=False):
        calls.append(len(slots))
        if len(calls) == 1:
            raise RuntimeError("planted: the host-to-device copy failed")
        real_load(handle, slots, ahead)

    mover.load = load
    try:
        got = sessions(engine)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == want
    assert stats["host_kv_load_failures"] == 1 and stats["internal_errors"] == 0
    assert len(calls) > 1 and stats["host_kv_hit_tokens"] > 0


@pytest.mark.parametrize("staging", [False, True])
def test_an_abort_while_blocks_load_ends_that_request_only(model, tok, reference, staging):
    """With staging (and overlap scheduling, as on a GPU) the load under way may be a
    staged one, of a request still waiting."""
    want, _ = reference
    engine = make_engine(model, tok, 1 << 20, staging=staging, overlap=staging)
    mover = engine.scheduler.cache._mover
    real_load, victim = mover.load, {}

    def on_turn(turn, i, handle):
        if turn == 1 and i == 2:
            victim["handle"] = handle

    def load(handle, slots, ahead=False):  # the copy is under way when the abort arrives
        target = victim.pop("handle", None)
        if target is not None:
            target.abort()
        real_load(handle, slots, ahead)

    mover.load = load
    try:
        got = sessions(engine, on_turn=on_turn)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert not victim  # a load ran after the victim was submitted
    aborted = [k for k, (reason, _) in enumerate(got) if reason == "abort"]
    assert len(aborted) == 1 and stats["internal_errors"] == 0
    assert stats["requests_finished"]["abort"] == 1  # counted
    k = aborted[0]
    assert got[:k] == want[:k]
    # the aborted turn wrote fewer tokens, so its session goes on from another history;
    # every other session is unaffected
    other = [j for j in range(k + 1, len(want)) if j % SESSIONS != k % SESSIONS]
    assert [got[j] for j in other] == [want[j] for j in other]


def queued_sessions(engine, turns=2, n=6, on_wave=None):
    """Every session's turn submitted at once to an engine running one request at a time:
    the queue waits while its head's prefixes can be staged. on_wave(turn): called once
    each turn's requests are submitted."""
    rng = random.Random(11)
    history = [[rng.randrange(3000, 9000) for _ in range(30)] for _ in range(n)]
    out = []
    for turn in range(turns):
        handles = [engine.submit(EngineRequest(tuple(h), greedy(4))) for h in history]
        if on_wave is not None:
            on_wave(turn)
        for h, result in zip(history, [x.result(timeout=120) for x in handles]):
            out.append(result.token_ids)
            h += list(result.token_ids) + [rng.randrange(3000, 9000) for _ in range(9)]
    return out


def test_staging_loads_the_queue_head_ahead_with_the_same_tokens(model, tok):
    runs = {}
    for name, host, staging, overlap in (
        ("off", 0, False, False),
        ("host", 1 << 20, False, False),
        ("staged", 1 << 20, True, False),
        # overlap scheduling (a GPU's default): step N + 1 planned while step N runs
        ("staged, overlapped", 1 << 20, True, True),
    ):
        engine = launch_engine(
            model,
            tok,
            eos_token_ids=EOS,
            max_total_tokens=POOL,
            cache_config=CacheConfig(host_kv_cache_bytes=host, host_kv_staging=staging),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=128, max_running_requests=1),
            engine_config=EngineConfig(check_integrity=True, overlap=overlap),
        )
        try:
            runs[name] = (queued_sessions(engine), engine.stats())
        finally:
            engine.shutdown()
    assert runs["staged"][0] == runs["host"][0] == runs["off"][0]
    assert runs["staged, overlapped"][0] == runs["off"][0]
    overlapped = runs["staged, overlapped"][1]
    assert overlapped["host_kv_staged_tokens"] > 0 and overlapped["internal_errors"] == 0
    host, staged = runs["host"][1], runs["staged"][1]
    assert host["host_kv_staged_tokens"] == 0 and host["host_kv_hit_tokens"] > 0
    assert staged["host_kv_staged_tokens"] > 0
    assert staged["host_kv_hit_tokens"] < host["host_kv_hit_tokens"]  # found on the device
    # the same prefixes come back from the host, ahead instead of at admission, and
    # staging the queue's head pushes out no more than admission's loads did
    loaded = staged["host_kv_hit_tokens"] + staged["host_kv_staged_tokens"]
    assert loaded == host["host_kv_hit_tokens"]
    assert staged["host_kv_written_tokens"] <= host["host_kv_written_tokens"]
    assert staged["prefill_tokens"] < runs["off"][1]["prefill_tokens"]


def test_a_pool_too_small_for_two_matches_loads_only_for_requests_that_fit(model, tok):
    """A pool of 100 slots under two running requests: a returning turn's host-tier prefix
    often does not fit beside the other request. Admission checks the fit before loading
    (a request released after its load would waste the copy and count it twice), so a
    load is never cut short; the greedy tokens are those of tiers off."""
    runs = {}
    for name, host, staging, overlap in (
        ("off", 0, False, False),
        ("host", 1 << 20, False, False),
        ("staged, overlapped", 1 << 20, True, True),
    ):
        engine = launch_engine(
            model,
            tok,
            eos_token_ids=EOS,
            max_total_tokens=100,
            cache_config=CacheConfig(host_kv_cache_bytes=host, host_kv_staging=staging),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=128, max_running_requests=2),
            engine_config=EngineConfig(check_integrity=True, overlap=overlap),
        )
        try:
            runs[name] = (queued_sessions(engine, turns=3), engine.stats())
        finally:
            engine.shutdown()
    assert runs["host"][0] == runs["off"][0] == runs["staged, overlapped"][0]
    for name in ("host", "staged, overlapped"):
        stats = runs[name][1]
        assert stats["host_kv_partial_loads"] == stats["host_kv_short_tokens"] == 0, name
        assert stats["host_kv_hit_tokens"] > 0 and stats["internal_errors"] == 0, name
        assert stats["cached_host_tokens"] <= stats["cached_tokens"], name
        assert stats["prefill_tokens"] < runs["off"][1]["prefill_tokens"], name


PER_TOKEN = 2 * 2 * 2 * 16 * 4  # TINY's KV bytes per token: layers, K and V, heads, dim, fp32


def test_the_disk_tier_under_a_small_host_tier_stays_exact(model, tok, reference, tmp_path):
    want, _ = reference
    engine = make_engine(
        model, tok, 40 * PER_TOKEN, disk_kv_cache_bytes=1 << 20, disk_kv_cache_dir=str(tmp_path)
    )
    try:
        got = sessions(engine)
        stats = engine.stats()
        files = list(tmp_path.glob("lmprog-kv-*/*.blk"))
        ram, disk = held_bytes(engine)
    finally:
        engine.shutdown()
    assert got == want
    assert ram == stats["host_kv_used_bytes"] <= 40 * PER_TOKEN
    assert disk == stats["disk_kv_used_bytes"] <= 1 << 20
    assert sum(f.stat().st_size for f in files) - 20 * len(files) == disk  # 20-byte headers
    assert stats["disk_kv_written_tokens"] > 0
    assert stats["disk_kv_hit_tokens"] + stats["disk_kv_staged_tokens"] > 0
    assert len(files) > 0 and stats["disk_kv_used_tokens"] > 0
    assert stats["host_kv_used_tokens"] <= 40


def test_a_soak_keeps_each_tier_within_its_budget_at_every_wave(model, tok, reference4, tmp_path):
    """A host tier of 40 tokens over a disk tier of 120, both evicting, over four turns:
    between the steps of every wave the host tier's tensors (whole storages) and the disk
    tier's files (as the file system has them, headers aside) are what the tiers count and
    within each budget; outputs as with the tiers off."""
    engine = make_engine(
        model,
        tok,
        40 * PER_TOKEN,
        disk_kv_cache_bytes=120 * PER_TOKEN,
        disk_kv_cache_dir=str(tmp_path),
    )
    tier, seen = engine.scheduler.cache.prefix_cache.tier, []

    def on_turn(turn, i, handle):
        ram, disk, files = held_bytes(engine, tmp_path)  # between two steps
        seen.append((ram, disk, files))
        assert ram <= 40 * PER_TOKEN and disk == files <= 120 * PER_TOKEN
        assert tier.used_tokens <= 40 and tier.disk_used_tokens <= 120

    try:
        got = sessions(engine, turns=4, on_turn=on_turn)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == reference4 and stats["internal_errors"] == 0
    assert stats["disk_kv_evicted_tokens"] > 0 and stats["disk_kv_written_tokens"] > 0
    assert max(d for _, d, _ in seen) > 0 and max(r for r, _, _ in seen) > 0


@pytest.fixture(scope="module")
def reference4(model, tok):
    """Four turns with the tiers off (the fault tests' last turn runs after the fault)."""
    engine = make_engine(model, tok, 0)
    try:
        return sessions(engine, turns=4)
    finally:
        engine.shutdown()


def test_damaged_disk_blocks_are_recomputed(model, tok, reference4, tmp_path):
    """As turn 2 starts every block file is cut short or has a byte flipped; the requests
    that need them recompute, the failures are counted (stats and /metrics), and the blocks
    written since load in turn 3."""
    from lmprog.serve.metrics import ServerMetrics

    engine = make_engine(
        model, tok, 40 * PER_TOKEN, disk_kv_cache_bytes=1 << 20, disk_kv_cache_dir=str(tmp_path)
    )
    at = {}

    def on_turn(turn, i, handle):
        if turn == 2 and i == 0:
            for k, path in enumerate(sorted(tmp_path.glob("lmprog-kv-*/*.blk"))):
                try:
                    data = bytearray(path.read_bytes())
                    if k % 2:
                        data[len(data) // 2] ^= 0x40  # corrupt: the checksum fails
                    else:
                        data = data[: len(data) // 2]  # truncated
                    path.write_bytes(bytes(data))
                except FileNotFoundError:  # the engine loaded or dropped it meanwhile
                    pass
        elif turn == 3 and i == 0:
            at["turn 3"] = engine.stats()

    try:
        got = sessions(engine, turns=4, on_turn=on_turn)
        stats = engine.stats()
        text = ServerMetrics(engine.stats).render().decode()
    finally:
        engine.shutdown()
    assert got == reference4
    failures = stats["host_kv_load_failures"]
    assert failures > 0 and stats["internal_errors"] == 0
    assert f"lmprog_host_kv_cache_load_failures_total {float(failures)}" in text
    before = at["turn 3"]
    disk_loads = stats["disk_kv_hit_tokens"] + stats["disk_kv_staged_tokens"]
    assert disk_loads > before["disk_kv_hit_tokens"] + before["disk_kv_staged_tokens"]


def full_disk_open(real_open):
    """open() for lmprog.core.blockfile as on a full disk: a block file takes its header,
    then its payload's write fails with ENOSPC."""
    import errno

    class Full:
        def __init__(self, f):
            self.f, self.writes = f, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.writes += 1
            if self.writes > 1:
                raise OSError(errno.ENOSPC, "planted: no space left on device")
            return self.f.write(data)

    def fake(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Full(f) if "w" in mode else f

    return fake


def test_a_full_disk_drops_those_blocks_and_the_next_requests_spill_again(
    model, tok, reference4, tmp_path, monkeypatch
):
    """During turn 1 every block write fails as on a full disk (a half-written temporary file
    each): those blocks are dropped (recomputed when they return), no file is left behind,
    the failures are counted (stats, /metrics); from turn 2 on the disk takes blocks again
    and gives them back."""
    import builtins

    from lmprog.core import blockfile
    from lmprog.serve.metrics import ServerMetrics

    engine = make_engine(
        model, tok, 40 * PER_TOKEN, disk_kv_cache_bytes=1 << 20, disk_kv_cache_dir=str(tmp_path)
    )
    at = {}

    def on_turn(turn, i, handle):
        if turn == 1 and "full" not in at:
            at["full"] = engine.stats()
            monkeypatch.setattr(blockfile, "open", full_disk_open(builtins.open), raising=False)
        elif turn == 2 and "freed" not in at:
            at["freed"] = engine.stats()
            monkeypatch.delattr(blockfile, "open")

    try:
        got = sessions(engine, turns=4, on_turn=on_turn)
        stats = engine.stats()
        text = ServerMetrics(engine.stats).render().decode()
        files = {p.name for p in tmp_path.glob("lmprog-kv-*/*")}
        _, disk = held_bytes(engine)
    finally:
        engine.shutdown()
    assert got == reference4 and stats["internal_errors"] == 0
    failures = stats["disk_kv_write_failures"]
    assert failures > 0 and failures == at["freed"]["disk_kv_write_failures"]
    assert f"lmprog_disk_kv_cache_write_failures_total {float(failures)}" in text
    assert not [f for f in files if f.endswith(".tmp")]  # no half-written file stays
    assert disk == stats["disk_kv_used_bytes"]  # the files are what the tier counts
    freed = at["freed"]
    assert stats["disk_kv_written_tokens"] > freed["disk_kv_written_tokens"]
    disk_loads = stats["disk_kv_hit_tokens"] + stats["disk_kv_staged_tokens"]
    assert disk_loads > freed["disk_kv_hit_tokens"] + freed["disk_kv_staged_tokens"]


def one_at_a_time(model, tok, host_bytes, pool):
    """An engine running one request at a time (a queue waits behind it)."""
    return launch_engine(
        model,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=pool,
        cache_config=CacheConfig(host_kv_cache_bytes=host_bytes),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=128, max_running_requests=1),
        engine_config=EngineConfig(check_integrity=True),
    )


def test_host_blocks_evicted_while_their_requests_wait_are_recomputed(model, tok):
    """Six requests queued behind one running request, their prefixes in the host tier
    (the pool holds two histories); the tier then evicts every block (planted: as a burst
    of other traffic would) while they wait. They recompute with the same tokens, the
    eviction is counted, and the next turn's requests load from the host again."""
    engine = one_at_a_time(model, tok, 0, 100)
    try:
        want = queued_sessions(engine, turns=3)
    finally:
        engine.shutdown()
    engine = one_at_a_time(model, tok, 1 << 20, 100)
    cache, marks = engine.scheduler.cache.prefix_cache, []

    def on_wave(turn):
        if turn in (1, 2):
            marks.append(engine.stats())
        if turn == 1:  # the wave is queued: the host tier drops every block
            assert engine.call(lambda: cache.host_size) > 0
            engine.call(lambda: cache._evict_host(cache.host_size))

    try:
        got = queued_sessions(engine, turns=3, on_wave=on_wave)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got == want
    assert stats["internal_errors"] == 0 and stats["host_kv_load_misses"] == 0
    queued, after = marks  # when turn 1 was queued, and when turn 2 was
    assert after["host_kv_evicted_tokens"] > queued["host_kv_evicted_tokens"]
    assert stats["host_kv_hit_tokens"] > after["host_kv_hit_tokens"]  # turn 2 loads again


def test_a_failed_step_fails_its_requests_only_and_the_engine_serves_on(
    model, tok, reference, tmp_path
):
    """A step that fails inside the scheduler (the H100's "extend needs N slots", planted
    once, with overlap scheduling and staging on, as on a GPU) fails the requests it had
    started; a request still waiting keeps its place and runs; the bookkeeping, the tiers
    and their files are dropped (they cannot be trusted), and the engine serves on with the
    same tokens as before."""
    want, _ = reference
    engine = make_engine(
        model, tok, 40 * PER_TOKEN, overlap=True, staging=True,
        disk_kv_cache_bytes=1 << 20, disk_kv_cache_dir=str(tmp_path),
    )  # fmt: skip
    cache = engine.scheduler.cache
    prompts = [(5, 6, 7), (8, 9, 10, 11), (12, 13)]
    try:
        assert sessions(engine) == want
        assert list(tmp_path.glob("lmprog-kv-*/*.blk"))

        def boom(reqs, counts):
            del cache.extend  # once
            raise AssertionError("planted: extend needs 99 slots; check available_tokens first")

        cache.extend = boom
        handles = [engine.submit(EngineRequest(p, greedy(3))) for p in prompts]
        outcomes = []
        for h in handles:
            try:
                outcomes.append(h.result(timeout=60).token_ids)
            except BackendError as exc:
                assert "internal error" in str(exc)
                outcomes.append(None)
        # the failed step held at most two (max_running_requests): the third waited
        assert 1 <= outcomes.count(None) <= 2
        stats = engine.stats()
        assert stats["internal_errors"] == 1
        assert stats["host_kv_used_tokens"] == stats["disk_kv_used_tokens"] == 0
        assert not list(tmp_path.glob("lmprog-kv-*/*.blk"))  # no file left behind
        again = [engine.submit(EngineRequest(p, greedy(3))).result(timeout=60) for p in prompts]
        assert all(o is None or o == a.token_ids for o, a in zip(outcomes, again))
        assert sessions(engine) == want  # the tiers fill again, the same tokens
    finally:
        engine.shutdown()
