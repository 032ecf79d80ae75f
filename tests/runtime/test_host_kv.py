"""HostKVMover (issue 34): a KV pool's rows copied to host memory and to disk-tier files and
back bit for bit; a file that is truncated, corrupt or missing is refused on load; a
process's disk folder is removed with it, and a dead process's on the next start."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lmprog.core.blockfile import BlockFileError
from lmprog.runtime.executor.host_kv import HostKVMover
from lmprog.runtime.executor.kv_pool import KVPool


@pytest.fixture
def pool():
    p = KVPool(32, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.bfloat16, device="cpu")
    p._buffer.copy_(torch.randn(p._buffer.shape, generator=torch.Generator().manual_seed(0)))
    return p


def rows(pool, slots):
    return pool._buffer[:, :, torch.as_tensor(slots)].clone()


def test_rows_go_to_disk_and_come_back_bit_for_bit(pool, tmp_path):
    mover = HostKVMover(pool, disk_dir=str(tmp_path))
    assert mover.bytes_per_token == 2 * 2 * 2 * 4 * 2  # layers, K/V, heads, dim, bf16
    src, dst = np.array([3, 4, 5, 9]), np.array([20, 21, 22, 23])
    want = rows(pool, src)
    block = mover.spill(mover.save(src))
    assert os.path.getsize(block.ref.path) > block.ref.nbytes == 4 * mover.bytes_per_token
    upper, lower = mover.split_disk(block, 1)
    assert not os.path.exists(block.ref.path)
    mover.load_disk(upper, dst[:1])
    mover.load_disk(lower, dst[1:])
    assert torch.equal(rows(pool, dst), want)
    mover.discard(upper)
    assert not os.path.exists(upper.ref.path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "swap"])
def test_a_damaged_file_is_refused(pool, tmp_path, damage):
    mover = HostKVMover(pool, disk_dir=str(tmp_path))
    block = mover.spill(mover.save(np.array([1, 2, 3])))
    other = mover.spill(mover.save(np.array([4, 5, 6])))
    data = open(block.ref.path, "rb").read()
    if damage == "truncate":  # a write cut short
        open(block.ref.path, "wb").write(data[: len(data) // 2])
    elif damage == "flip":
        open(block.ref.path, "wb").write(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "delete":
        os.unlink(block.ref.path)
    else:  # another block's file under this name
        os.replace(other.ref.path, block.ref.path)
    before = rows(pool, np.array([10, 11, 12]))
    with pytest.raises(BlockFileError):
        mover.load_disk(block, np.array([10, 11, 12]))
    assert torch.equal(rows(pool, np.array([10, 11, 12])), before)  # nothing written


def test_the_disk_folder_goes_with_its_mover_and_a_dead_process(pool, tmp_path):
    mover = HostKVMover(pool, disk_dir=str(tmp_path))
    folder = mover.disk.path
    assert os.path.isdir(folder) and os.path.dirname(folder) == str(tmp_path)
    del mover
    assert not os.path.exists(folder)
    # a process killed with its folder left behind (a write under way: a .tmp file)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f"lmprog-kv-{dead.stdout.strip()}-abc"
    stale.mkdir()
    (stale / "0.blk.tmp").write_bytes(b"half a block")
    HostKVMover(pool, disk_dir=str(tmp_path))
    assert not stale.exists()


def test_layer_loads_wait_per_layer_and_leave_staged_copies_to_the_next_step():
    """LayerLoads (CUDA's layer-wise loading) with stand-in events: a forward pass waits for
    a layer's copies when it reaches it, once; staged copies only in the step after; a save
    of a slot being written waits for every copy, a save of another slot for none."""
    from lmprog.runtime.executor.layer_loads import LayerLoads

    waited = []
    loads = LayerLoads(16, waited.append)
    for layer in range(3):
        loads.record(layer, f"admit{layer}")
        loads.record(layer, f"stage{layer}", ahead=True)
    loads.add_slots(np.array([1, 2]))
    loads.add_slots(np.array([5, 6]), ahead=True)
    loads.fence(np.array([9, 10]))  # slots no load writes: nothing to wait for
    loads.wait(0)
    loads.wait(0)
    assert waited == ["admit0"]
    loads.wait(2)
    loads.step_done()  # layer 1 was not reached (a graph's step): waited at the end
    assert waited == ["admit0", "admit2", "admit1"]
    loads.fence(np.array([1, 2]))  # the admitted copies are done on the current stream
    assert len(waited) == 3 and loads.pending
    loads.wait(1)  # the next forward pass waits for the staged copies
    assert waited[-1] == "stage1"
    loads.fence(np.array([6]))  # a save of a staged slot: every copy left first
    assert waited[-2:] == ["stage0", "stage2"] and not loads.pending
    loads.step_done()
    assert len(waited) == 6


def test_a_cpu_pool_loads_synchronously_without_layer_waits(pool):
    mover = HostKVMover(pool)
    src, dst = np.array([3, 4, 5]), np.array([20, 21, 22])
    want = rows(pool, src)
    handle = mover.save(src)
    mover.load(handle, dst, ahead=True)
    assert pool.loads is None  # nothing to wait for: the copy is done on return
    assert torch.equal(rows(pool, dst), want)
    pool.wait_layer(0)
    pool.fence_loads()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream is CUDA's")
@pytest.mark.parametrize("arena", [False, True])
def test_cuda_loads_land_layer_by_layer_and_saves_wait_for_them(arena):
    pool = KVPool(256, num_layers=4, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16,
                  device="cuda")  # fmt: skip
    pool._buffer.copy_(torch.randn(pool._buffer.shape, device="cuda"))
    per = pool._buffer.element_size() * pool._buffer[:, :, :1].numel()
    mover = HostKVMover(pool, host_bytes=200 * per if arena else 0)
    src, dst = np.arange(1, 101), np.arange(120, 220)
    want = rows(pool, src).cpu()
    handle = mover.save(src)
    mover.load(handle, dst)
    assert pool.loads is not None and pool.loads.pending
    for layer in range(4):  # as a forward pass: each layer waits for its own copies
        pool.wait_layer(layer)
        assert torch.equal(pool._buffer[layer, :, torch.as_tensor(dst)].cpu(), want[layer])
    staged = mover.save(dst[:10])
    mover.load(staged, np.arange(230, 240), ahead=True)
    again = mover.save(np.arange(230, 240))  # a save of slots still being written waits
    torch.cuda.synchronize()
    got = again.parts()[0].movedim(1, 2).view(want.dtype)  # [layers, tokens, ...] in the tier
    assert torch.equal(got, want[:, :, :10]) and not pool.loads.pending


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream is CUDA's")
def test_cuda_a_host_block_dropped_while_its_copy_runs_still_lands_whole():
    """The host tier drops a block's host copy as soon as its load is queued (the node moves
    to the device; on disk, the read-back tensor goes out of scope): the pinned allocator
    must not hand that memory out again before the side stream's copy has read it. Fresh
    pinned tensors of the same size, written at once, must not reach the pool."""
    pool = KVPool(4096, num_layers=8, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                  device="cuda")  # fmt: skip
    pool._buffer.copy_(torch.randn(pool._buffer.shape, device="cuda"))
    mover = HostKVMover(pool)
    src, dst = np.arange(1, 1001), np.arange(2000, 3000)
    want = rows(pool, src).cpu()
    handle = mover.save(src)
    torch.cuda.synchronize()
    torch.cuda._sleep(10_000_000)  # the side stream waits for this: the copy starts late
    mover.load(handle, dst)
    del handle  # dropped while the copy is queued
    junk = [torch.full(want.shape, 7, dtype=want.dtype, pin_memory=True) for _ in range(4)]
    pool.fence_loads()
    torch.cuda.synchronize()
    assert torch.equal(rows(pool, dst).cpu(), want)
    del junk


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream is CUDA's")
def test_cuda_arena_runs_freed_while_their_load_runs_are_not_overwritten():
    """An arena block dropped as soon as its load is queued gives its runs back only once
    the side stream's copy has read them: a save that needs those runs waits for it."""
    pool = KVPool(4096, num_layers=8, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                  device="cuda")  # fmt: skip
    pool._buffer.copy_(torch.randn(pool._buffer.shape, device="cuda"))
    per = pool._buffer.element_size() * pool._buffer[:, :, :1].numel()
    mover = HostKVMover(pool, host_bytes=1000 * per)
    src, dst, other = np.arange(1, 1001), np.arange(2000, 3000), np.arange(1001, 2001)
    want = rows(pool, src).cpu()
    handle = mover.save(src)
    torch.cuda.synchronize()
    torch.cuda._sleep(10_000_000)  # the side stream waits for this: the copy starts late
    mover.load(handle, dst)
    del handle  # its runs go back after the load's copies
    again = mover.save(other)  # the whole arena: reuses those runs
    assert again.release is not None and again.runs == [(0, 1000)]
    pool.fence_loads()
    torch.cuda.synchronize()
    assert torch.equal(rows(pool, dst).cpu(), want)


class FakeEvent:
    def __init__(self):
        self.done, self.waited = False, False

    def query(self):
        return self.done

    def synchronize(self):  # blocks only when not done
        self.waited, self.done = self.waited or not self.done, True


def test_the_arena_hands_out_runs_and_takes_them_back_merged():
    from lmprog.runtime.executor.host_kv import HostArena

    arena = HostArena(10, torch.zeros(2, 1, 3), pinned=False)
    assert tuple(arena.buffer.shape) == (2, 10, 3)
    a, b, c = arena.take(3), arena.take(4), arena.take(2)
    assert (a, b, c) == ([(0, 3)], [(3, 4)], [(7, 2)]) and arena.free_tokens == 1
    assert arena.take(2) is None and arena.free_tokens == 1  # nothing taken
    arena.give(a)
    assert arena.take(4) == [(0, 3), (9, 1)]  # no run of 4 free: the first ones
    arena.give(b)
    event = FakeEvent()
    arena.give(c, event)  # freed once the copies queued before it are done
    assert arena.free_tokens == 4 and arena.take(2) == [(3, 2)]  # b's, c still pending
    event.done = True
    assert arena.take(4) == [(5, 4)] and not event.waited  # b's rest merged with c's
    late = FakeEvent()
    arena.give([(3, 2)], late)
    assert arena.take(2) == [(3, 2)] and late.waited  # short of slots: waited for
    arena.give([(0, 3), (9, 1)])
    arena.give([(3, 2)])
    arena.give([(5, 4)])
    assert arena._free == [(0, 10)] and arena.free_tokens == 10


def test_blocks_in_the_arena_round_trip_split_and_free_their_runs(pool, tmp_path):
    per = pool._buffer.element_size() * pool._buffer[:, :, :1].numel()
    mover = HostKVMover(pool, disk_dir=str(tmp_path), host_bytes=12 * per + per // 2)
    arena = mover.arena
    assert arena is not None and arena.tokens == 12
    first = mover.save(np.array([1, 2, 3, 4]))
    gap = mover.save(np.array([5, 6]))
    second = mover.save(np.array([7, 8, 9]))
    del gap  # a hole of 2: the next block of 4 takes it and the 3 at the end
    src = np.array([10, 11, 12, 13])
    want = rows(pool, src)
    spread = mover.save(src)
    assert spread.runs == [(4, 2), (9, 2)] and arena.free_tokens == 1
    mover.load(spread, np.array([20, 21, 22, 23]))
    assert torch.equal(rows(pool, np.array([20, 21, 22, 23])), want)
    upper, lower = mover.split(spread, 3)  # no copy: the runs parted
    assert (upper.runs, lower.runs) == ([(4, 2), (9, 1)], [(10, 1)])
    del spread
    assert arena.free_tokens == 1  # its runs are the parts'
    mover.load(lower, np.array([24]))
    mover.load(upper, np.array([25, 26, 27]))
    assert torch.equal(rows(pool, np.array([25, 26, 27, 24])), want)
    full = mover.save(np.array([14, 15, 16]))  # no room: a tensor of its own
    assert full.release is None and full.buffer is not arena.buffer
    block = mover.spill(upper)  # a block of two runs to disk and back
    mover.load_disk(block, np.array([28, 29, 30]))
    assert torch.equal(rows(pool, np.array([28, 29, 30])), want[:, :, :3])
    del upper, lower, first, second, full
    assert arena.free_tokens == 12 and arena._free == [(0, 12)]
