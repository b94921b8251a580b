"""The prefix cache: full pages of finished (and running) requests, found again by content.

Identity. A full 16-token page is keyed by a chained 128-bit XXH3 hash,
``h_i = H(h_{i-1} || the page's 16 token ids as int32)``, ``h_-1 = H(namespace)``. The
namespace covers the model fingerprint, the weight mode, the backend's arithmetic (attention
variant, CPU kernel) and the request's ``cache_salt``, each length-prefixed; nothing goes
through Python's ``hash``, ``repr`` or pickle. A hit is confirmed by comparing the page's
stored token ids and its parent page, never by the hash alone.

Sharing. A new request maps every leading matching page into its page table (one more
owner) and computes only the rest, always at least its last token (its logits are needed).
Only full pages are ever shared and a request only writes positions past its hits, so no
page is written while another request can read it: no copy-on-write. A page is published
when the step that completed it has returned its results (its K/V writes come before any
later step in stream order); an aborted or preempted request publishes nothing more.

Eviction. A page whose last owner leaves goes to the tail of the allocator's free queue and
stays indexed. The allocator takes free pages from the head, and a request frees its pages
last-first, so the oldest page goes first and a chain loses its children before its
parents. A page handed out again leaves the index (``forget``). A hit on an unowned page
pulls it out of the middle of the free queue (``FreePageQueue.remove``). Beyond the budget
(resident pages, chain length, chains) nothing new is published, and when the resident
budget is exceeded the least recently released unowned pages are forgotten first.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import xxhash

from crucible.engine.prefix_spans import PAGE_BYTES, SPAN_PAGES, SpanIndex
from crucible.step.batch import PAGE_SIZE


def namespace_key(*parts: str) -> bytes:
    """The root of every chain: H(length-prefixed UTF-8 parts)."""
    data = b"".join(struct.pack("<I", len(b)) + b for b in (p.encode() for p in parts))
    return xxhash.xxh3_128_digest(data)


def page_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """H(parent || a full page's 16 token ids as little-endian int32): a page's identity,
    which ``extend_chain`` and ``publish_run`` compute over ids packed by ``_pack``."""
    return xxhash.xxh3_128_digest(parent + _pack(tokens))


def _pack(tokens: Sequence[int]) -> bytes:
    """Any number of ids as little-endian int32, in one call (struct packs them in a third
    of numpy's time). The cache keeps a page's ids so: an entry is bytes, which the garbage
    collector does not track (tuples of ints were ~40 tracked objects per 1,000 tokens
    published, and the collections they caused showed on every step)."""
    return struct.pack(f"<{len(tokens)}i", *tokens)


@dataclass
class CacheStats:
    queries: int = 0  # admissions that looked the cache up
    hits: int = 0  # of them, those that reused at least one page
    hit_tokens: int = 0  # positions not recomputed
    admissions: int = 0  # pages published
    evictions: int = 0  # pages forgotten (reused by the allocator, or over budget)
    fill_waits: int = 0  # admissions put off while another request filled the prefix


@dataclass
class PrefixCache:
    """The index over the page pool; the allocator calls ``forget`` before reusing a page."""

    parts: tuple[str, ...]  # the namespace's fixed parts: format, model, weight mode
    arithmetic: str  # the backend's (Backend.arithmetic); a change clears the cache
    max_pages: int  # resident budget in pages
    max_tokens: int = 8192  # longest retained prefix per chain
    max_entries: int = 4096  # most retained chains (roots)
    page_bytes: int = 0  # K/V bytes of one page (for the resident-bytes figure)
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        # What an indexed page holds, in dicts of bytes (untracked by the collector):
        self._pages: dict[bytes, int] = {}  # key -> page
        self._keys: dict[int, bytes] = {}  # page -> its key
        self._parents: dict[int, bytes] = {}  # page -> its parent's key (the root's: h_-1)
        self._ids: dict[int, bytes] = {}  # page -> its 16 ids, packed (_pack)
        self._content: dict[bytes, int] = {}  # its parent's key + its ids -> page (match)
        self._root_pages: set[int] = set()  # pages that start a chain
        self._spans = SpanIndex()  # runs of four indexed pages (match's long strides)
        self._unowned: OrderedDict[int, None] = OrderedDict()  # indexed, no owner, LRU first
        self._roots_cache: dict[str | None, bytes] = {}

    # -- identity --------------------------------------------------------------------------
    @property
    def base(self) -> str:
        """The namespace without the salt."""
        return namespace_key(*self.parts, self.arithmetic).hex()

    def follow(self, arithmetic: str) -> None:
        """The backend now computes with ``arithmetic`` (an attention variant switch): when
        that changed, nothing cached is valid any more."""
        if arithmetic != self.arithmetic:
            self.clear()
            self.arithmetic = arithmetic
            self._roots_cache.clear()

    def root(self, salt: str | None) -> bytes:
        key = self._roots_cache.get(salt)
        if key is None:
            key = namespace_key(self.base, "salt", salt or "")
            self._roots_cache[salt] = key
        return key

    @property
    def num_pages(self) -> int:
        return len(self._keys)

    # -- lookups (admission) ---------------------------------------------------------------
    def match(self, tokens: Sequence[int], salt: str | None, chain: list[bytes]) -> list[int]:
        """The pages of ``tokens``' leading full pages that are cached, at most up to (not
        including) the page of the last token. ``chain`` (the request's keys so far) is
        extended to every such page (``extend_chain``: an admitted request claims them all,
        engine/filling.py); keys it already holds (from an admission that found no free
        pages, or from publishing before a preemption) are kept.

        The walk looks pages up by their whole content, the parent's key and the page's
        ids (the bytes the key hashes), so a hit is confirmed by the ids themselves and a
        matched page's key is the one stored with it: only pages past the hits are hashed.
        (A chat turn maps ~100 pages; hashing and checking each was ~60% of a cached
        admission's host time.) Where four pages at a time were indexed together, one
        lookup takes all four (engine/prefix_spans.py)."""
        limit = self._limit(tokens)
        pages: list[int] = []
        raw = _pack(tokens[: limit * PAGE_SIZE]) if limit > 0 else b""
        get, keys, step = self._content.get, self._keys, PAGE_BYTES
        parent, start = self._spans.walk(self.root(salt), raw, keys, pages)
        for at in range(start, len(raw), step):
            page = get(parent + raw[at : at + step])
            if page is None:
                break
            pages.append(page)
            parent = keys[page]
        if len(chain) < len(pages):
            chain.extend(map(keys.__getitem__, pages[len(chain) :]))
        self.extend_chain(tokens, salt, chain, raw)
        return pages

    def _limit(self, tokens: Sequence[int]) -> int:
        """Pages of ``tokens`` a lookup may match: full ones before the last token's."""
        return min((len(tokens) - 1) // PAGE_SIZE, self.max_tokens // PAGE_SIZE)

    def extend_chain(self, tokens: Sequence[int], salt: str | None, chain: list[bytes],
                     raw: bytes | None = None) -> int:
        """Extend ``chain`` with the keys of ``tokens``' pages that ``match`` could find;
        returns how many pages that is. engine/filling.py claims and looks up pages being
        filled by these keys, before they are published. ``raw``: the ids of those pages
        packed already (``match``'s)."""
        limit = self._limit(tokens)
        first = len(chain)
        if first < limit:  # the pages' ids packed in one call (a call a page cost 3x)
            step = PAGE_BYTES
            raw = raw[first * step :] if raw is not None else \
                _pack(tokens[first * PAGE_SIZE : limit * PAGE_SIZE])
            parent = chain[-1] if chain else self.root(salt)
            for at in range(0, len(raw), step):
                parent = xxhash.xxh3_128_digest(parent + raw[at : at + step])
                chain.append(parent)
        return max(limit, 0)

    def record(self, pages: Sequence[int]) -> None:
        """An admission used ``pages`` from ``match`` (counted once, when it is admitted)."""
        self.stats.queries += 1
        if pages:
            self.stats.hits += 1
            self.stats.hit_tokens += len(pages) * PAGE_SIZE

    # -- publishing (after a step) ---------------------------------------------------------
    def publish_run(self, pages: Sequence[int], first: int, end: int, tokens: Sequence[int],
                    salt: str | None, chain: list[bytes]) -> None:
        """Index the request's pages ``first`` .. ``end - 1`` (of its page table ``pages``
        and its ids ``tokens``) where the budget allows and no page with the same content is
        indexed; ``chain`` holds the keys of pages 0 .. first - 1 at least (extended here). One run a request a step, its ids packed in one call (1.7
        us a page against 2.0 a call a page at best on the CI machine; docs/prefix-cache.md)."""
        end = min(end, self.max_tokens // PAGE_SIZE)  # pages past the longest prefix kept
        if end <= first:
            return
        step = PAGE_BYTES
        raw = _pack(tokens[first * PAGE_SIZE : end * PAGE_SIZE])
        keys, by_key, parents, ids_of = self._keys, self._pages, self._parents, self._ids
        content, stats = self._content, self.stats
        parent = chain[first - 1] if first else self.root(salt)
        for index in range(first, end):
            ids = raw[(index - first) * step : (index - first + 1) * step]
            key = chain[index] if index < len(chain) else \
                xxhash.xxh3_128_digest(parent + ids)
            if index == len(chain):
                chain.append(key)
            page = pages[index]
            if key not in by_key and page not in keys and \
                    (index or len(self._root_pages) < self.max_entries) and \
                    (len(keys) < self.max_pages or self._shed(1)):
                by_key[key] = page
                keys[page], parents[page], ids_of[page] = key, parent, ids
                content[parent + ids] = page
                if index == 0:
                    self._root_pages.add(page)
                stats.admissions += 1
                if index % SPAN_PAGES == SPAN_PAGES - 1:
                    self._add_span(page)
            parent = key

    def _add_span(self, page: int) -> None:
        """Index the span that ``page`` (just indexed) ends, if its three parents are
        indexed too. Followed by the parents' keys, the four pages form one chain by
        construction, and the span's bytes are their stored parent and ids."""
        pages, get, parents = [page], self._pages.get, self._parents
        for _ in range(SPAN_PAGES - 1):
            parent = get(parents[page])
            if parent is None:
                return
            pages.append(parent)
            page = parent
        pages.reverse()
        ids = self._ids
        self._spans.add(parents[pages[0]], [ids[p] for p in pages], pages)

    def _shed(self, n: int) -> bool:
        """Forget the ``n`` least recently released unowned pages; False if too few."""
        if len(self._unowned) < n:
            return False
        for _ in range(n):
            page, _ = self._unowned.popitem(last=False)
            self.forget(page)
        return True

    # -- the allocator's side --------------------------------------------------------------
    def forget(self, page: int) -> None:
        """``page`` is about to hold something else: drop it from the index."""
        key = self._keys.pop(page, None)
        if key is None:
            return
        del self._content[self._parents[page] + self._ids[page]]
        del self._pages[key], self._parents[page], self._ids[page]
        self._unowned.pop(page, None)
        self._root_pages.discard(page)
        self._spans.drop(page)
        self.stats.evictions += 1

    def released(self, page: int) -> None:
        """``page`` lost its last owner (it stays indexed until reused)."""
        if page in self._keys:
            self._unowned[page] = None

    def acquired(self, pages: Sequence[int]) -> None:
        """``pages`` gained an owner again (a hit's run of them)."""
        pop = self._unowned.pop
        for page in pages:
            pop(page, None)

    def indexed(self, page: int) -> bool:
        return page in self._keys

    def clear(self) -> None:
        """The namespace changed: nothing cached is valid any more."""
        for page in list(self._keys):
            self.forget(page)

    def check(self) -> None:
        """Internal consistency (tests call it after every step)."""
        assert len(self._pages) == len(self._keys) == len(self._parents) == len(self._ids) \
            == len(self._content)
        for page, key in self._keys.items():
            assert self._pages[key] == page and len(self._ids[page]) == PAGE_BYTES
            assert self._content[self._parents[page] + self._ids[page]] == page
        assert set(self._unowned) <= set(self._keys)
        assert self._root_pages <= set(self._keys)
        self._spans.check(self._parents, self._keys, self._ids)


def cache_counters(cache: PrefixCache | None) -> dict[str, int]:
    """A cache's counters and what it holds, as the engine's stats name them (all zero for
    no cache)."""
    if cache is None:
        return dict.fromkeys(("cache_queries", "cache_hits", "cache_hit_tokens",
                              "cache_admissions", "cache_evictions", "cache_pages",
                              "cache_resident_bytes", "cache_fill_waits"), 0)
    s = cache.stats
    return {"cache_queries": s.queries, "cache_hits": s.hits, "cache_hit_tokens": s.hit_tokens,
            "cache_admissions": s.admissions, "cache_evictions": s.evictions,
            "cache_pages": cache.num_pages,
            "cache_resident_bytes": cache.num_pages * cache.page_bytes,
            "cache_fill_waits": s.fill_waits}
