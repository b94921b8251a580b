import pytest
from hypothesis import given, settings, strategies as st

from crucible.engine.pages import FreePageQueue, PageAllocator, PageTable, pages_for


def test_pages_for():
    assert [pages_for(n) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_free_queue_order_and_middle_removal():
    q = FreePageQueue(5)
    assert list(q) == [0, 1, 2, 3, 4]
    q.remove(2)  # from the middle, as a prefix-cache hit will do
    q.remove(0)  # head
    q.remove(4)  # tail
    assert list(q) == [1, 3] and len(q) == 2
    assert 2 not in q and 3 in q
    q.append(2)
    assert list(q) == [1, 3, 2]
    assert [q.popleft(), q.popleft(), q.popleft()] == [1, 3, 2]
    with pytest.raises(IndexError):
        q.popleft()
    with pytest.raises(ValueError):
        q.remove(1)
    q.append(1)
    with pytest.raises(ValueError):
        q.append(1)


def test_a_hits_pages_leave_the_queue_together():
    """remove_all / take_all (a prefix hit's run of pages) do what remove / take do a page
    at a time; a page not in the queue stops remove_all with the queue still consistent."""
    q = FreePageQueue(8)
    q.remove_all([3, 0, 7, 4])
    assert list(q) == [1, 2, 5, 6] and len(q) == 4
    with pytest.raises(ValueError):
        q.remove_all([5, 3])  # 5 goes, 3 is not in the queue
    assert list(q) == [1, 2, 6] and len(q) == 3
    a, b = PageAllocator(6), PageAllocator(6)
    for alloc in (a, b):
        alloc.free(alloc.allocate(6)[::-1])  # every page free again, in a shuffled order
        alloc.take(2)
    want = [2, 5, 0]
    a.take_all(want)
    for page in want:
        b.take(page)
    assert [a.refcount(p) for p in range(6)] == [b.refcount(p) for p in range(6)]
    assert a.count_free(range(6)) == b.count_free(range(6)) == 3
    assert list(a._free) == list(b._free) and a.num_free == b.num_free == 3


def test_allocate_free_refcounts():
    a = PageAllocator(4)
    pages = a.allocate(3)
    assert len(set(pages)) == 3 and a.num_free == 1 and a.num_used == 3
    assert all(a.refcount(p) == 1 for p in pages)
    with pytest.raises(MemoryError):
        a.allocate(2)
    assert a.num_free == 1  # all or nothing
    a.incref(pages[0])
    a.free([pages[0]])
    assert a.refcount(pages[0]) == 1 and a.num_free == 1  # still owned by the other owner
    a.free(pages)
    assert a.num_free == 4
    with pytest.raises(ValueError):
        a.free([pages[1]])
    with pytest.raises(ValueError):
        a.incref(pages[1])


def test_freed_pages_are_reused_least_recent_first():
    a = PageAllocator(3)
    p = a.allocate(3)
    a.free([p[2]])
    a.free([p[0]])
    assert a.allocate(2) == [p[2], p[0]]


def test_page_table_grow_and_release():
    a = PageAllocator(3)
    t = PageTable()
    assert t.grow(a, 17) and len(t) == 2
    assert t.grow(a, 32) and len(t) == 2  # still fits
    assert not t.grow(a, 49) and len(t) == 2 and a.num_free == 1  # needs 2 more, has 1
    assert t.pages_missing(48) == 1
    t.release(a)
    assert len(t) == 0 and a.num_free == 3


def test_grow_within_the_last_page_needs_no_free_page():
    a = PageAllocator(2)
    t = PageTable()
    assert t.grow(a, 20) and a.num_free == 0
    before = list(t.pages)
    for n in (0, 1, 20, 32):  # all fit the two pages held: True, nothing taken
        assert t.grow(a, n) and t.pages == before and a.num_free == 0
    assert not t.grow(a, 33) and t.pages == before  # a third page: none left


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 80)), max_size=60))
def test_tables_never_share_pages_and_all_come_back(ops):
    a = PageAllocator(12)
    tables = [PageTable() for _ in range(4)]
    sizes = [0] * 4
    for which, n in ops:
        t = tables[which]
        if n == 0:
            t.release(a)
            sizes[which] = 0
            continue
        target = sizes[which] + n
        before = list(t.pages)
        if t.grow(a, target):
            sizes[which] = target
            assert t.pages[: len(before)] == before  # growth only appends
        else:
            assert t.pages == before
        owned = [p for tb in tables for p in tb.pages]
        assert len(owned) == len(set(owned))
        assert a.num_free + len(owned) == 12
    for t in tables:
        t.release(a)
    assert a.num_free == 12
