"""Page allocator: refcounted physical pages of the one KV pool, plus per-request page tables.

Invariants:
- a page is either free (refcount 0, in the free queue) or owned (refcount >= 1, not in it);
- ``num_free + sum(owned pages) == num_pages`` at all times;
- every page a request holds goes back through ``PageTable.release`` when the request
  finishes, is aborted or is preempted (the tests assert ``num_free == num_pages`` after
  every workload).

The free queue is an *intrusive* doubly linked list over page ids (two int lists, ``prev``
and ``next``), not a deque: the prefix cache (planned; docs/engine.md) will keep full pages of
finished requests in this same queue, unreferenced and evictable in LRU order, and a
prefix hit must pull such a page out of the *middle* of the queue in O(1)
(``FreePageQueue.remove``). Allocation pops the least recently freed page from the head;
freed pages are appended at the tail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from crucible.step.batch import PAGE_SIZE

if TYPE_CHECKING:
    from crucible.engine.prefix_cache import PrefixCache


def pages_for(num_positions: int) -> int:
    """Pages needed to hold positions ``0 .. num_positions - 1``."""
    return (num_positions + PAGE_SIZE - 1) // PAGE_SIZE


class FreePageQueue:
    """Intrusive doubly linked list of page ids with O(1) popleft, append and remove."""

    __slots__ = ("_prev", "_next", "_head", "_tail", "_linked", "_len")

    def __init__(self, num_pages: int) -> None:
        # None (not -1) marks the ends of the list.
        self._prev: list[int | None] = [None] * num_pages
        self._next: list[int | None] = [None] * num_pages
        self._linked = [False] * num_pages
        self._head: int | None = None
        self._tail: int | None = None
        self._len = 0
        for page in range(num_pages):
            self.append(page)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, page: int) -> bool:
        return self._linked[page]

    def append(self, page: int) -> None:
        if self._linked[page]:
            raise ValueError(f"page {page} is already in the free queue")
        self._prev[page], self._next[page] = self._tail, None
        if self._tail is None:
            self._head = page
        else:
            self._next[self._tail] = page
        self._tail = page
        self._linked[page] = True
        self._len += 1

    def remove(self, page: int) -> None:
        """Unlink ``page`` wherever it sits (a prefix hit on an evictable page)."""
        self.remove_all((page,))

    def remove_all(self, pages: Sequence[int]) -> None:
        """Unlink each of ``pages`` wherever it sits, in one loop (a prefix hit takes ~100
        evictable pages at once)."""
        prev, nxt, linked = self._prev, self._next, self._linked
        for page in pages:
            if not linked[page]:
                raise ValueError(f"page {page} is not in the free queue")
            self._len -= 1
            p, n = prev[page], nxt[page]
            if p is None:
                self._head = n
            else:
                nxt[p] = n
            if n is None:
                self._tail = p
            else:
                prev[n] = p
            prev[page] = nxt[page] = None
            linked[page] = False

    def popleft(self) -> int:
        if self._head is None:
            raise IndexError("free queue is empty")
        page = self._head
        self.remove(page)
        return page

    def __iter__(self):
        page = self._head
        while page is not None:
            yield page
            page = self._next[page]


class PageAllocator:
    """Hands out physical page ids of a pool of ``num_pages`` pages, with refcounts."""

    __slots__ = ("num_pages", "_refcount", "_free", "cache")

    def __init__(self, num_pages: int, cache: "PrefixCache | None" = None) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self._refcount = [0] * num_pages
        self._free = FreePageQueue(num_pages)
        self.cache = cache  # free pages it indexes stay findable until handed out again

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free pages (refcount 1 each); all or nothing."""
        if n > len(self._free):
            raise MemoryError(f"need {n} pages, only {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(n)]
        for page in pages:
            self._refcount[page] = 1
            if self.cache is not None:
                self.cache.forget(page)  # it holds something else from now on
        return pages

    def count_free(self, pages: Sequence[int]) -> int:
        """How many of ``pages`` nobody owns (cached pages waiting in the free queue)."""
        return list(map(self._refcount.__getitem__, pages)).count(0)

    def take(self, page: int) -> None:
        """Own a cached page (a prefix hit): out of the free queue if nobody owned it."""
        self.take_all((page,))

    def take_all(self, pages: Sequence[int]) -> None:
        """``take`` each of ``pages`` (a prefix hit's run of them), in whole-list steps."""
        rc = self._refcount
        unowned = [p for p in pages if not rc[p]]
        self._free.remove_all(unowned)
        if self.cache is not None:
            self.cache.acquired(unowned)
        for page in pages:
            rc[page] += 1

    def incref(self, page: int) -> None:
        """Share an owned page read-only (a prefix-cache hit adds an owner)."""
        if self._refcount[page] == 0:
            raise ValueError(f"page {page} is free; it cannot gain an owner")
        self._refcount[page] += 1

    def free(self, pages: list[int]) -> None:
        """Drop one reference from each page; a page whose last owner left is free again."""
        for page in pages:
            count = self._refcount[page]
            if count <= 0:
                raise ValueError(f"page {page} freed more times than it was allocated")
            self._refcount[page] = count - 1
            if count == 1:
                self._free.append(page)
                if self.cache is not None:
                    self.cache.released(page)


class PageTable:
    """One request's logical -> physical page map; grows as positions are computed."""

    __slots__ = ("pages",)

    def __init__(self) -> None:
        self.pages: list[int] = []

    def __len__(self) -> int:
        return len(self.pages)

    def pages_missing(self, num_positions: int) -> int:
        """How many more pages are needed to hold ``num_positions`` positions."""
        return max(0, pages_for(num_positions) - len(self.pages))

    def grow(self, allocator: PageAllocator, num_positions: int) -> bool:
        """Make room for ``num_positions`` positions; False (nothing taken) if pages lack."""
        if num_positions <= len(self.pages) * PAGE_SIZE:
            return True  # most decode steps: the last page still has a free slot
        missing = self.pages_missing(num_positions)
        if not allocator.can_allocate(missing):
            return False
        self.pages.extend(allocator.allocate(missing))
        return True

    def release(self, allocator: PageAllocator) -> None:
        """Give every page back (finish, abort, preemption); the table is empty after. Last
        page first: the free queue then hands out a chain's deepest pages before its first
        ones, so a cached prefix loses its children before its parents."""
        allocator.free(self.pages[::-1])
        self.pages = []
