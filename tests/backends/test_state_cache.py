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
