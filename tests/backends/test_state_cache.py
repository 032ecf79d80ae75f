"""The saved-state cache on plain data: longest-prefix lookup, LRU order, the byte bound."""

from __future__ import annotations

import threading

import pytest

from lmprog.backends.state_cache import StateCache, common_prefix_len


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([7], [1]) == 0
    assert common_prefix_len(list(range(5000)), list(range(5000))) == 5000


def test_lookup_returns_the_longest_common_prefix():
    c = StateCache(1000)
    c.put([1, 2, 3, 4], b"a" * 10)
    c.put([1, 2, 9], b"b" * 10)
    c.put([5, 6], b"c" * 10)
    m = c.lookup([1, 2, 3, 7, 8])
    assert m.state.tokens == (1, 2, 3, 4) and m.common == 3 and m.state.blob == b"a" * 10
    m = c.lookup([1, 2, 9, 9])
    assert m.state.tokens == (1, 2, 9) and m.common == 3
    assert c.lookup([8, 8]) is None
    assert c.lookup([1, 5], min_common=2) is None
    assert c.longest_common([5, 6, 7]) == 2


def test_lru_eviction_respects_the_byte_bound():
    c = StateCache(30)
    c.put([1], b"x" * 10)
    c.put([2], b"x" * 10)
    c.put([3], b"x" * 10)
    c.lookup([1])  # 1 is now the most recently used; 2 is the oldest
    c.put([4], b"x" * 15)  # needs 15 bytes: evicts 2, then 3
    assert c.lookup([2]) is None and c.lookup([3]) is None
    assert c.lookup([1]) is not None and c.lookup([4]) is not None
    assert c.nbytes == 25 and c.evictions == 2
    c.check_integrity()


def test_oversized_and_empty_entries_are_not_stored():
    c = StateCache(10)
    assert not c.put([1, 2], b"x" * 11)
    assert not c.put([], b"x")
    assert len(c) == 0
    assert StateCache(0).put([1], b"x") is False
    with pytest.raises(ValueError):
        StateCache(-1)


def test_put_replaces_an_equal_key():
    c = StateCache(100)
    c.put([1, 2], b"old")
    c.put([1, 2], b"newer")
    assert len(c) == 1 and c.nbytes == 5 and c.lookup([1, 2]).state.blob == b"newer"
    c.check_integrity()


def test_concurrent_use_keeps_the_books_straight():
    c = StateCache(500)

    def worker(base):
        for i in range(200):
            c.put([base, i % 7, i], b"y" * (1 + i % 13))
            c.lookup([base, i % 7])

    threads = [threading.Thread(target=worker, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.check_integrity()


def test_the_disk_tier_keeps_what_memory_evicts_and_gives_it_back(tmp_path):
    c = StateCache(20, disk_bytes=25, disk_dir=str(tmp_path))
    for i in range(1, 5):
        c.put([i, i], bytes([i]) * 10)  # memory keeps two; the disk two more, then drops
    c.check_integrity()
    assert c.stats()["disk_entries"] == 2 and c.stats()["disk_evictions"] == 0
    c.put([5, 5], b"\x05" * 10)  # the disk is full: its oldest entry ([1, 1]) goes
    assert c.stats()["disk_evictions"] == 1 and c.lookup([1, 1]) is None
    assert len(list(tmp_path.glob("lmprog-kv-*/*.blk"))) == 2
    m = c.lookup([2, 2, 7])  # on disk: read back, checked, moved into memory
    assert m.state.blob == b"\x02" * 10 and m.common == 2
    assert c.stats()["disk_hits"] == 1
    c.check_integrity()
    assert c.longest_common([3, 3]) == 2  # on disk now too
    c.clear()
    assert not list(tmp_path.glob("lmprog-kv-*/*.blk"))


def test_a_damaged_disk_entry_falls_back_and_a_full_disk_drops(tmp_path):
    c = StateCache(10, disk_bytes=100, disk_dir=str(tmp_path))
    c.put([1, 2, 3], b"a" * 10)
    c.put([1, 2], b"b" * 10)  # [1, 2, 3] goes to the disk
    (path,) = tmp_path.glob("lmprog-kv-*/*.blk")
    path.write_bytes(path.read_bytes()[:-3])  # cut short
    m = c.lookup([1, 2, 3, 4])  # the disk's longer match fails its check: memory's serves
    assert m.state.tokens == (1, 2) and c.stats()["disk_failures"] == 1
    assert c.stats()["disk_entries"] == 0 and not path.exists()
    c.check_integrity()

    def full(*args, **kwargs):
        raise OSError(28, "planted: no space left on device")

    c._dir.write = full
    c.put([9], b"c" * 10)  # [1, 2] cannot be written: dropped, counted
    assert c.stats()["disk_write_failures"] == 1 and c.lookup([1, 2]) is None
    c.check_integrity()


def test_a_soak_keeps_memory_and_files_within_their_bounds(tmp_path):
    """Random puts and lookups of states of random sizes over both tiers, with a damaged
    file and a full disk now and then: after every operation the bytes held in memory and
    the files on disk (as the file system has them, headers aside) stay within their
    bounds, every entry's blob is the one put under its tokens, and the books agree."""
    import random

    from lmprog.backends.state_cache import Match

    rng = random.Random(3)
    c = StateCache(400, disk_bytes=1000, disk_dir=str(tmp_path))
    real_write = c._dir.write

    def blob_of(key):
        return bytes([sum(key) % 256]) * (10 + 7 * len(key))

    def full(payload):
        raise OSError(28, "planted: no space left on device")

    for step in range(1500):
        key = [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
        if rng.random() < 0.5:
            c.put(key, blob_of(key))
        else:
            m = c.lookup(key)
            assert m is None or isinstance(m, Match)
            if m is not None:
                assert m.state.blob == blob_of(m.state.tokens)
                assert list(m.state.tokens[: m.common]) == key[: m.common]
        if step % 31 == 0:  # damage a file
            files = sorted(tmp_path.glob("lmprog-kv-*/*.blk"))
            if files:
                path = rng.choice(files)
                path.write_bytes(path.read_bytes()[:-1])
        c._dir.write = full if step % 200 < 20 else real_write
        c.check_integrity()
        on_disk = sum(f.stat().st_size - 20 for f in tmp_path.glob("lmprog-kv-*/*.blk"))
        assert c.nbytes <= 400 and on_disk <= c.disk_nbytes <= 1000  # a cut file is shorter
    stats = c.stats()
    assert stats["disk_hits"] > 0 and stats["disk_evictions"] > 0
    assert stats["disk_failures"] > 0 and stats["disk_write_failures"] > 0
