"""Prompt pages being filled: which running request is computing each full prompt page that
it will publish to the prefix cache, so that a waiting request whose next pages are those
waits for them instead of computing them a second time.

A burst of requests behind one new system prompt or few-shot header (a client's batch, the
first turn of many chats) arrives before any of them has published that prefix. Admitted
together, each computes all of it: with a 1,024-token budget a 500-token prefix is computed
again by every request admitted until the first one's pages are published, two steps later
when steps are pipelined. Here the first request admitted claims the full prompt pages it
computes (their chain keys, ``claim``); a waiting request whose first page past its cache
hits is claimed by another running request stays waiting (``blocker``), and the requests
behind it in the queue are still admitted. Once the owner publishes that page, the waiter's
next lookup maps it like any other hit, and the waiter computes only what is its own.
SGLang's scheduler does the like within one admission round (its in-batch prefix caching
puts off requests whose uncached prefix another request of that round is computing).

The wait is bounded by the owner's progress, never by its lifetime: it ends when the owner
has published the page (or tried to: a full cache refuses it, and the waiter computes the
page itself), stops running (finished, aborted, preempted) or releases its claims. A running
request always gets its slices before admissions do, so an owner never waits on a waiter.
The bits cannot change: a waiter maps pages that a cold run of its own would have computed
the same way (the prefix cache's contract, DESIGN.md 7). A waiter is only held for a run of
at least MIN_RUN claimed pages, or all of its own if fewer remain: sharing one page of a
long prompt would cost the waiter a step or two for 16 tokens.
"""

from __future__ import annotations

from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.request import Request, RequestStatus

MIN_RUN = 4  # claimed pages a waiter's next pages must hold before it waits for them


class Filling:
    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self._owners: dict[bytes, tuple[Request, int]] = {}  # key -> (owner, page index)
        self._claims: dict[int, list[bytes]] = {}  # id(owner) -> the keys it claimed

    @property
    def num_waits(self) -> int:
        """Admissions put off (a request once per wait): the cache's ``fill_waits``."""
        return self.cache.stats.fill_waits

    def __len__(self) -> int:
        return len(self._owners)

    def claim(self, req: Request, first: int) -> None:
        """``req``, admitted with ``first`` pages from the cache, computes its full pages
        from ``first`` on (those a later lookup could match): claim the ones no other
        running request has."""
        chain, owners = req.chain, self._owners
        limit = self.cache.extend_chain(req.token_ids, req.cache_salt, chain)
        mine = []
        for i in range(first, limit):  # every admission: kept to a few dict operations a page
            key = chain[i]
            entry = owners.get(key)
            if entry is None or self._live(entry) is None:
                owners[key] = (req, i)
                mine.append(key)
        if mine:
            self._claims.setdefault(id(req), []).extend(mine)

    def release(self, req: Request) -> None:
        """``req`` stops running (finished, aborted, preempted): its claims end."""
        for key in self._claims.pop(id(req), ()):
            entry = self._owners.get(key)
            if entry is not None and entry[0] is req:
                del self._owners[key]

    def blocker(self, req: Request, hits: int) -> tuple[Request, int] | None:
        """(owner, page index) when ``req``'s next MIN_RUN matchable pages past its ``hits``
        (all of them, if fewer) are claimed by one other running request that has not yet
        published the first; None when ``req`` should be admitted now."""
        if not self._owners:
            return None
        # (match extended the chain to every matchable page: no hashing here)
        limit = min(hits + MIN_RUN,
                    self.cache.extend_chain(req.token_ids, req.cache_salt, req.chain))
        if hits >= limit:
            return None
        first = self._live(self._owners.get(req.chain[hits]))
        if first is None or first[0] is req:
            return None
        for i in range(hits + 1, limit):
            entry = self._owners.get(req.chain[i])
            if entry is None or entry[0] is not first[0]:
                return None
        return first

    @staticmethod
    def waits(entry: tuple[Request, int] | None) -> bool:
        """Whether a wait recorded as ``entry`` still holds (the owner runs and has not
        published the page): checked before a new lookup, so a queue of waiters costs a
        few attribute reads a step, not a walk of their prompts."""
        return Filling._live(entry) is not None

    @staticmethod
    def _live(entry: tuple[Request, int] | None) -> tuple[Request, int] | None:
        if entry is None:
            return None
        owner, index = entry
        if owner.status is not RequestStatus.RUNNING or owner.num_published > index:
            return None
        return entry
