"""TokenSlotAllocator and ReqToTokenTable on plain data."""

import numpy as np
import pytest

from lmprog.runtime.cache import IntegrityError, ReqToTokenTable, TokenSlotAllocator


def test_alloc_hands_out_distinct_slots_and_never_slot_zero():
    a = TokenSlotAllocator(10)
    got = np.concatenate([a.alloc(3), a.alloc(3), a.alloc(4)])
    assert sorted(got.tolist()) == list(range(1, 11))
    assert a.num_free == 0
    a.check_integrity()


def test_exhaustion_returns_none_and_changes_nothing():
    a = TokenSlotAllocator(8)
    first = a.alloc(5)
    assert a.alloc(4) is None
    assert a.num_free == 3
    rest = a.alloc(3)
    assert a.alloc(1) is None
    a.free(first)
    assert a.num_free == 5
    again = a.alloc(5)
    assert sorted(again.tolist()) == sorted(first.tolist())
    assert not set(again.tolist()) & set(rest.tolist())


def test_alloc_zero_is_empty():
    a = TokenSlotAllocator(4)
    assert len(a.alloc(0)) == 0 and a.num_free == 4


def test_pages_round_up_and_are_contiguous():
    a = TokenSlotAllocator(num_slots=18, page_size=4)  # 4 whole pages; 2 slots unused
    assert a.num_slots == 16 and a.num_pages == 4
    s = a.alloc(5)  # 2 pages
    assert len(s) == 8 and a.num_free == 8
    pages = s.reshape(-1, 4)
    assert ((pages[:, 0] - 1) % 4 == 0).all()  # each page starts on a page boundary
    assert (np.diff(pages, axis=1) == 1).all()  # and is contiguous
    assert a.alloc(9) is None  # would need 3 pages, only 2 free
    a.free(s)
    assert a.num_free == 16
    assert sorted(a.free_slots().tolist()) == list(range(1, 17))


def test_pool_smaller_than_a_page_is_rejected():
    with pytest.raises(ValueError, match="at least one page"):
        TokenSlotAllocator(num_slots=3, page_size=4)


def test_integrity_catches_double_free():
    a = TokenSlotAllocator(6)
    s = a.alloc(2)
    a.alloc(2)
    a.free(s)
    a.check_integrity()
    a.free(s[:1])  # slot freed a second time
    with pytest.raises(IntegrityError, match="free twice"):
        a.check_integrity()


def test_req_table_rows_and_zeroing():
    t = ReqToTokenTable(max_running_requests=2, max_context_len=10, page_size=4)
    assert t.width == 12  # rounded up to whole pages
    r0, r1 = t.alloc(), t.alloc()
    assert {r0, r1} == {0, 1} and t.alloc() is None
    t.table[r0, :5] = [5, 6, 7, 8, 9]
    t.free(r0, used_len=5)
    assert not t.table[r0].any()
    assert t.alloc() == r0
    t.check_integrity()
    t._free_rows.append(r1)  # planted: a row both in use and free
    with pytest.raises(IntegrityError):
        t.check_integrity()
