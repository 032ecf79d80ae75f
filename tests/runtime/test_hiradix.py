"""HiRadixCache (issue 34): the radix tree with a host tier under it, torch-free. The
"KV pool" here is a numpy array whose slot holds its token's id, so every load can be checked
to bring back exactly the KV of the tokens it claims."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmprog.runtime.cache import TokenSlotAllocator
from lmprog.runtime.cache.hiradix import HiRadixCache, OnDisk


class ArrayMover:
    bytes_per_token = 8

    def __init__(self, num_slots: int) -> None:
        self.pool = np.full(num_slots + 1, -1, dtype=np.int64)
        self.fail_next_load = False
        self.disk = {}

    def save(self, slots):
        return self.pool[slots].copy()

    def load(self, handle, slots, ahead=False):
        if self.fail_next_load:
            self.fail_next_load = False
            raise OSError("planted: the copy failed")
        self.pool[slots] = handle

    def split(self, handle, k):
        return handle[:k], handle[k:]

    # a disk tier in a dict: key -> (rows, intact)
    disk: dict
    disk_full = False

    def spill(self, handle):
        if self.disk_full:
            raise OSError(28, "planted: no space left on device")
        key = self.files = getattr(self, "files", 0) + 1
        self.disk[key] = (handle.copy(), True)
        return key

    def load_disk(self, key, slots, ahead=False):
        rows, intact = self.disk[key]
        if not intact:
            raise OSError("planted: the block's checksum does not match")
        self.pool[slots] = rows

    def split_disk(self, key, k):
        if not self.disk[key][1]:
            raise OSError("planted: the block's checksum does not match")
        rows, intact = self.disk.pop(key)
        a, b = self.spill(rows[:k]), self.spill(rows[k:])
        return a, b

    def discard(self, key):
        del self.disk[key]


class Tiered:
    """A HiRadixCache with its allocator and pool, as CacheManager drives them."""

    def __init__(self, slots=64, host=64, page=1, disk=0):
        self.mover = ArrayMover(slots)
        self.alloc = TokenSlotAllocator(slots, page)
        self.cache = HiRadixCache(page, "lru", self.mover, host, disk)

    def write(self, ids):
        """Compute ids (their slots hold their ids) and cache them, as a finished request."""
        self.make_room(len(ids))
        slots = self.alloc.alloc(len(ids))
        assert slots is not None
        self.mover.pool[slots] = ids
        present = self.cache.insert(ids, slots)
        self.alloc.free(slots[:present])

    def make_room(self, n):
        short = n - self.alloc.num_free
        if short > 0:
            self.alloc.free(self.cache.evict(short))

    def alloc_evicting(self, n):  # as CacheManager's: as much of n as the pool can take
        self.make_room(n)
        fits = min(n, self.alloc.num_free)
        return self.alloc.alloc(fits) if fits else None

    def admit(self, ids, limit=10**9):
        """Match, lock, load the host part (as CacheManager.admit); return (slots, node)."""
        match = self.cache.match_prefix(ids)
        self.cache.lock(match.last_node)
        loaded, unused = self.cache.load(match, limit, self.alloc_evicting)
        self.alloc.free(unused)
        self.cache.lock(loaded.last_node)
        self.cache.unlock(match.last_node)
        return loaded.slots, loaded.last_node

    def check(self, locks=()):
        self.cache.check_integrity(list(locks))
        assert len(self.mover.disk) == sum(  # every file belongs to a disk node
            1 for n in self._host_nodes() if isinstance(n.host, OnDisk)
        )
        held = np.concatenate([self.cache.all_slots(), self.alloc.free_slots()])
        assert sorted(held.tolist()) == list(range(1, self.alloc.num_slots + 1))

    def _host_nodes(self):
        out, stack = [], [self.cache.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for child in (node.host_children or {}).values():
                out.append(child)
                stack.append(child)
        return out


def test_an_evicted_prefix_goes_to_the_host_and_comes_back_with_its_kv():
    t = Tiered(slots=32, host=64)
    a = list(range(100, 120))
    t.write(a)
    t.write(list(range(500, 530)))  # needs the room: a is evicted into the host tier
    assert t.cache.tier.written_tokens == 20 and t.cache.host_size == 20
    assert t.cache.cached_prefix_len(a + [7]) == 20
    match = t.cache.match_prefix(a + [7])
    assert match.length == 0 and match.host_len == 20
    slots, node = t.admit(a + [7])
    assert len(slots) == 20 and t.mover.pool[slots].tolist() == a
    assert t.cache.tier.loaded_tokens == 20
    assert t.cache.host_size == 30  # the room for a pushed the other sequence out
    t.check([node])
    t.cache.unlock(node)
    t.check()


def test_a_partly_matched_host_node_is_split_and_a_budget_loads_part():
    t = Tiered(slots=40, host=64, page=4)
    a = list(range(100, 124))
    t.write(a)
    t.write(list(range(500, 540)))
    b = a[:12] + [9, 9, 9, 9]
    assert t.cache.cached_prefix_len(b) == 12
    slots, node = t.admit(b, limit=9)  # rounded down to two pages
    assert t.mover.pool[slots].tolist() == a[:8]
    t.check([node])
    assert t.cache.cached_prefix_len(a) == 24  # 8 on the device, 16 still on the host
    t.cache.unlock(node)
    slots, node = t.admit(a)
    assert t.mover.pool[slots].tolist() == a
    t.cache.unlock(node)
    t.check()


def test_a_pool_too_small_for_the_whole_match_loads_its_longest_prefix_that_fits():
    t = Tiered(slots=32, host=64, page=4)
    a, b = list(range(100, 124)), list(range(200, 224))
    t.write(a)
    t.write(b)  # a to the host
    held = t.cache.match_prefix(b).last_node
    t.cache.lock(held)  # a running request holds b: 8 slots free, none evictable
    slots, node = t.admit(a + [1])
    assert t.mover.pool[slots].tolist() == a[:8]  # two pages of six: the rest recomputed
    tier = t.cache.tier
    assert (tier.partial_loads, tier.short_tokens, tier.loaded_tokens) == (1, 16, 8)
    assert t.cache.stats()["host_kv_partial_loads"] == 1
    assert t.cache.cached_prefix_len(a) == 24 and t.cache.host_size == 16
    t.check([node, held])
    t.cache.unlock(node)
    t.cache.unlock(held)
    slots, node = t.admit(a + [1])  # with room again, the rest comes back
    assert t.mover.pool[slots].tolist() == a and tier.partial_loads == 1
    t.check([node])
    t.cache.unlock(node)
    t.check()


def test_the_host_tier_stays_within_its_budget_least_recently_used_first():
    t = Tiered(slots=16, host=24)
    seqs = [[1000 * (i + 1) + j for j in range(12)] for i in range(5)]
    for s in seqs:
        t.write(s)
        t.check()
        assert t.cache.host_size <= 24
    # the host holds seqs[2] and seqs[3] (the older ones went first); a read of seqs[2]
    # makes it the fresher, so room for seqs[4] takes seqs[3]
    assert [t.cache.cached_prefix_len(s) for s in seqs] == [0, 0, 12, 12, 12]
    t.cache.match_prefix(seqs[2])
    t.write([7] * 12)
    t.check()
    assert t.cache.tier.evicted_tokens == 36
    assert [t.cache.cached_prefix_len(s) for s in seqs] == [0, 0, 12, 0, 12]
    big = Tiered(slots=40, host=8)
    big.write(list(range(30)))
    big.write(list(range(100, 140)))  # 30 tokens do not fit a host tier of 8: dropped
    assert big.cache.tier.dropped_tokens == 30 and big.cache.host_size == 0
    big.check()


def test_nodes_being_loaded_are_kept_while_the_load_makes_room():
    t = Tiered(slots=24, host=24)
    a, b = list(range(100, 112)), list(range(200, 212))
    t.write(a)
    t.write(b)
    t.write(list(range(300, 324)))  # a and b to the host (24 tokens: full)
    assert t.cache.host_size == 24
    # loading a evicts the 24 device tokens into a full host tier: b goes, a is kept
    slots, node = t.admit(a + [1])
    assert t.mover.pool[slots].tolist() == a
    assert t.cache.cached_prefix_len(b) == 0
    t.check([node])


def test_a_host_node_gone_before_its_load_is_recomputed_and_counted():
    t = Tiered(slots=16, host=12)
    a = list(range(100, 112))
    t.write(a)
    t.write(list(range(200, 216)))  # a to the host
    match = t.cache.match_prefix(a + [1])
    assert match.host_len == 12
    t.write(list(range(300, 316)))  # the host tier evicts a while the match waits
    loaded, unused = t.cache.load(match, 100, t.alloc_evicting)
    t.alloc.free(unused)
    assert loaded.length == 0 and t.cache.tier.load_misses == 1
    t.check()


def test_a_failed_copy_drops_the_block_and_the_cache_goes_on():
    t = Tiered(slots=24, host=64)
    a, b = list(range(100, 112)), list(range(200, 212))
    t.write(a)
    t.write(b)
    t.write(list(range(300, 324)))
    t.mover.fail_next_load = True
    slots, node = t.admit(a + [1])
    assert len(slots) == 0 and t.cache.tier.load_failures == 1
    assert t.cache.cached_prefix_len(a) == 0
    t.cache.unlock(node)
    t.check()
    slots, node = t.admit(b + [1])  # the next one loads
    assert t.mover.pool[slots].tolist() == b
    t.cache.unlock(node)
    t.check()


def test_a_device_insert_over_a_host_child_replaces_it():
    t = Tiered(slots=16, host=64)
    a = list(range(100, 112))
    t.write(a)
    t.write(list(range(200, 216)))  # a to the host
    t.write(a[:4] + [5] * 8)  # computed again without loading: same first token
    assert t.cache.tier.dropped_tokens == 12 and t.cache.host_size == 16  # 200.. stays
    assert t.cache.cached_prefix_len(a) == 4
    t.check()


def test_reset_empties_every_tier_and_deletes_the_files():
    t = Tiered(slots=16, host=12, disk=64)
    for base in (100, 200, 300):
        t.write(list(range(base, base + 12)))
    assert t.mover.disk and t.cache.host_size == 12
    t.alloc.free(t.cache.reset())
    assert t.cache.host_size == 0 and t.cache.cached_prefix_len(list(range(100, 112))) == 0
    assert not t.mover.disk and t.cache.tier.disk_used_tokens == 0
    t.check()


def test_the_disk_tier_takes_what_the_host_evicts_and_gives_it_back():
    t = Tiered(slots=16, host=12, disk=24)
    seqs = [[1000 * (i + 1) + j for j in range(12)] for i in range(5)]
    for s in seqs:
        t.write(s)
        t.check()
    # device: seqs[4]; host: seqs[3]; disk: seqs[1], seqs[2] (seqs[0] dropped by the disk LRU)
    assert t.cache.tier.disk_written_tokens == 36 and t.cache.tier.disk_evicted_tokens == 12
    assert [t.cache.cached_prefix_len(s) for s in seqs] == [0, 12, 12, 12, 12]
    slots, node = t.admit(seqs[1] + [1])
    assert t.mover.pool[slots].tolist() == seqs[1]
    assert t.cache.tier.disk_loaded_tokens == 12 and t.cache.tier.loaded_tokens == 12
    t.check([node])
    t.cache.unlock(node)
    stats = t.cache.stats()
    assert stats["disk_kv_hit_tokens"] == 12 and stats["disk_kv_used_tokens"] <= 24


def test_a_corrupt_disk_block_is_recomputed_and_a_full_disk_drops():
    t = Tiered(slots=16, host=12, disk=48)
    a, b, c = ([base + j for j in range(12)] for base in (100, 200, 300))
    for s in (a, b, c):
        t.write(s)
    # a is on the disk, b and c above it: plant a bad checksum on a's block
    key = next(n.host.block for n in t._host_nodes() if n.key[0] == 100)
    t.mover.disk[key] = (t.mover.disk[key][0], False)
    slots, node = t.admit(a + [1])
    assert len(slots) == 0 and t.cache.tier.load_failures == 1
    t.cache.unlock(node)
    t.check()
    t.mover.disk_full = True
    t.write([400 + j for j in range(12)])  # c to the host, b to a full disk: dropped
    t.write([500 + j for j in range(12)])
    assert t.cache.tier.disk_write_failures >= 1
    t.check()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([1, 4]))
def test_random_traffic_keeps_both_tiers_consistent(seed, page):
    rng = random.Random(seed)
    t = Tiered(slots=48, host=rng.choice([16, 40, 200]), page=page, disk=rng.choice([0, 8, 64]))
    convos = [[rng.randrange(1, 5) * 1000 + j for j in range(4)] for _ in range(6)]
    for _ in range(30):
        i = rng.randrange(len(convos))
        ids = convos[i]
        slots, node = t.admit(ids, limit=rng.choice([0, 8, 1000]))
        assert t.mover.pool[slots].tolist() == ids[: len(slots)]
        t.check([node])
        t.cache.unlock(node)
        ids += [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
        n = min(len(ids), 44)
        t.write(ids[: n - n % page])
        t.check()
        assert t.cache.host_size <= t.cache.tier.capacity_tokens


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_host_kv_cache_bytes_is_checked(bad):
    from lmprog.runtime.config import CacheConfig

    with pytest.raises((TypeError, ValueError)):
        CacheConfig(host_kv_cache_bytes=bad)
    with pytest.raises(ValueError, match="radix_cache"):
        CacheConfig(host_kv_cache_bytes=100, radix_cache=False)


def test_a_corrupt_disk_block_that_a_load_splits_is_recomputed():
    """A load that takes part of a disk block splits its file first (read, checked, written
    as two): a bad file fails there, counted as a load failure, nothing else changed."""
    t = Tiered(slots=16, host=12, disk=48)
    a, b, c = ([base + j for j in range(12)] for base in (100, 200, 300))
    for s in (a, b, c):
        t.write(s)
    key = next(n.host.block for n in t._host_nodes() if n.key[0] == 100)
    t.mover.disk[key] = (t.mover.disk[key][0], False)
    slots, node = t.admit(a[:8] + [7, 7, 7, 7, 7])  # 8 of its 12 tokens: a split
    assert len(slots) == 0 and t.cache.tier.load_failures == 1
    t.cache.unlock(node)
    t.check()
    assert t.cache.cached_prefix_len(a) == 0
