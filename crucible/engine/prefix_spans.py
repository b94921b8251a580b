"""Four-page spans over the prefix cache's index, so a lookup walks a long cached prefix a
quarter as many steps.

``PrefixCache.match`` finds a request's cached pages one page at a time, each a dict lookup
by the parent's key and the page's 16 ids. A chat turn maps ~100 pages, so the walk was
~100 lookups of freshly built 80-byte keys (~0.25 us each here, twice that on a GPU
host's), for every request of a cohort, while the device waited for the cohort's step.

A span is four consecutive pages of one chain, starting at a page number divisible by
four (so a walk from the root meets them in step): it is found by its first page's parent
key and the four pages' ids, 256 bytes, and holds the four page numbers. Like a page's
entry it is confirmed by those bytes (a dict hit compares them), never by a hash alone;
a span hit therefore yields the very pages the page-by-page walk would. A span exists only
while all four of its pages are indexed: forgetting any one drops every span holding it
(a page where chains branch, such as a shared system prompt's last ones, sits in several),
so the pages a span hands out are always indexed ones. A span that could exist but does
not (one of its pages was indexed late) only costs the page-by-page walk.

Entries are bytes (keys, values, a page's spans as their keys end to end), which the
garbage collector does not track.
"""

from __future__ import annotations

import struct
from typing import Sequence

from crucible.step.batch import PAGE_SIZE

PAGE_BYTES = 4 * PAGE_SIZE  # a page's ids as the cache packs them: int32 each
SPAN_PAGES = 4
_PAGES = struct.Struct(f"<{SPAN_PAGES}i")
_KEY = 16 + PAGE_BYTES * SPAN_PAGES  # a 128-bit parent key + four pages' packed ids


class SpanIndex:
    """Spans of ``SPAN_PAGES`` indexed pages, by their first page's parent key + their ids."""

    __slots__ = ("_spans", "_span_of")

    def __init__(self) -> None:
        self._spans: dict[bytes, bytes] = {}  # parent key + 4 pages' packed ids -> pages
        self._span_of: dict[int, bytes] = {}  # page -> the keys of its spans, end to end

    def __len__(self) -> int:
        return len(self._spans)

    def add(self, parent: bytes, ids: Sequence[bytes], pages: Sequence[int]) -> None:
        """Index the span of ``pages`` (consecutive pages of one chain, indexed, the first
        at a page number divisible by ``SPAN_PAGES``), whose first page's parent key is
        ``parent`` and whose packed ids are ``ids``."""
        key = parent + b"".join(ids)
        if len(key) != _KEY or key in self._spans:
            return
        self._spans[key] = _PAGES.pack(*pages)
        span_of = self._span_of
        for page in pages:
            span_of[page] = span_of.get(page, b"") + key

    def drop(self, page: int) -> None:
        """``page`` leaves the index: so does every span holding it."""
        held = self._span_of.pop(page, None)
        if held is None:
            return
        span_of = self._span_of
        for key in _keys(held):
            for other in _PAGES.unpack(self._spans.pop(key)):
                if other == page:
                    continue
                theirs = span_of[other]
                if len(theirs) == _KEY:  # this span was its only one (most pages)
                    del span_of[other]
                else:
                    span_of[other] = b"".join(k for k in _keys(theirs) if k != key)

    def walk(self, parent: bytes, raw: bytes, keys: dict[int, bytes],
             pages: list[int]) -> tuple[bytes, int]:
        """Follow spans from ``parent`` (the root's key) over ``raw`` (the request's ids,
        packed), appending their pages to ``pages``; returns the last page's key (or
        ``parent``) and the bytes of ``raw`` consumed."""
        get, unpack, step, at = self._spans.get, _PAGES.unpack, PAGE_BYTES * SPAN_PAGES, 0
        while at + step <= len(raw):
            hit = get(parent + raw[at : at + step])
            if hit is None:
                break
            span = unpack(hit)
            pages.extend(span)
            parent = keys[span[-1]]
            at += step
        return parent, at

    def check(self, parents: dict[int, bytes], keys: dict[int, bytes],
              ids: dict[int, bytes]) -> None:
        """Every span's pages are indexed, form one chain, carry its ids and list it
        (tests)."""
        for key, packed in self._spans.items():
            span = _PAGES.unpack(packed)
            assert all(p in keys for p in span), f"span {span} holds a page not indexed"
            assert parents[span[0]] + b"".join(ids[p] for p in span) == key
            for a, b in zip(span, span[1:]):
                assert parents[b] == keys[a]
            assert all(key in _keys(self._span_of[p]) for p in span)
        assert sum(len(v) // _KEY for v in self._span_of.values()) == \
            SPAN_PAGES * len(self._spans)


def _keys(held: bytes) -> list[bytes]:
    """A page's span keys, from their bytes end to end."""
    return [held[at : at + _KEY] for at in range(0, len(held), _KEY)]
