"""Token-budget scheduler: decides which rows each step computes. It never touches an array.

One step = one packed forward. Policy (vLLM v1-like: no prefill or decode phase, only
``num_computed_tokens`` against each request's token list):
  1. decodes first: every running request with exactly one row left gets one row;
     if its next position needs a page and none is free, the most recently admitted
     running request is preempted (pages freed, request put back at the head of the
     waiting queue, recomputed later from prompt + generated tokens);
  2. running requests still prefilling get slices, in admission order, bounded by the
     remaining budget, the chunk cap and the pages still free (never preempting);
  3. waiting requests are admitted in FIFO order while budget and ``max_running`` allow and
     pages exist for their whole next slice; the first that does not fit stops admission.
     A request whose next prompt pages another running request is computing waits for
     them to be published, and those behind it go first (engine/filling.py).
If nothing could be scheduled while requests run (every running prefill is blocked on
pages), the most recent one is preempted and the step retried, so the engine never stalls:
any single request fits the pool alone (checked when it is added).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from crucible.step.batch import SegmentSpec
from crucible.engine.filling import Filling
from crucible.engine.pages import PageAllocator, pages_for, PAGE_SIZE
from crucible.engine.request import Request, RequestStatus
from crucible.errors import ConfigError, QueueFullError
from crucible.step.quick_init import quick_init


@dataclass(frozen=True)
class SchedulerConfig:
    token_budget: int = 1024  # rows per step
    chunk_cap: int | None = None  # longest slice of one request per step; None: off
    max_queue: int = 64  # waiting requests; beyond it add() refuses at once
    max_running: int = 256  # admitted requests holding pages

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ConfigError(f"token_budget must be >= 1, got {self.token_budget}")
        if self.chunk_cap is not None and self.chunk_cap < 1:
            raise ConfigError(f"chunk_cap must be >= 1 or None, got {self.chunk_cap}")
        if self.max_queue < 1:
            raise ConfigError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.max_running < 1:
            raise ConfigError(f"max_running must be >= 1, got {self.max_running}")


@quick_init  # built for every running request at every step
@dataclass(frozen=True)
class ScheduledSlice:
    request: Request
    start: int  # absolute position of the first row
    length: int  # rows
    prompt_rows: tuple[int, ...]  # offsets whose logits feed prompt logprobs
    sample: bool  # the slice ends at the last known token: its last row samples

    @property
    def logits_rows(self) -> tuple[int, ...]:
        if not self.prompt_rows:  # decodes and most prefills: no tuple to concatenate
            return (self.length - 1,) if self.sample else ()
        return self.prompt_rows + ((self.length - 1,) if self.sample else ())

    def segment(self) -> SegmentSpec:
        """This slice for ``build_packed_batch``. The spec shares the request's page list
        (no copy): the engine packs it into arrays at once, before any table changes."""
        r = self.request
        return SegmentSpec(r.request_id, r.token_ids[self.start : self.start + self.length],
                           self.start, r.page_table.pages, self.logits_rows)


@dataclass(frozen=True)
class StepPlan:
    slices: tuple[ScheduledSlice, ...]


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: PageAllocator) -> None:
        self.config = config
        self.allocator = allocator
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is preempted first
        self.num_preemptions = 0
        # the prompt pages running requests are computing (None without a prefix cache)
        self.filling = None if allocator.cache is None else Filling(allocator.cache)

    def check_room(self) -> None:
        """Refuse at once (QueueFullError, HTTP 429) when the waiting queue is full."""
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFullError(
                f"waiting queue is full ({self.config.max_queue} requests); retry later")

    def add(self, request: Request) -> None:
        self.check_room()
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def finish(self, request: Request, reason: str) -> None:
        """End a request (stop, length, abort): its pages go back before the next step."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            if self.filling is not None:
                self.filling.release(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.waits_on = None
        request.page_table.release(self.allocator)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        if self.filling is not None:
            self.filling.release(victim)
        victim.page_table.release(self.allocator)
        victim.num_computed_tokens = 0
        victim.num_published = 0  # what it published stays indexed for its return
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)  # resumes before anything newer

    def _slice(self, req: Request, n: int, start: int | None = None) -> ScheduledSlice:
        """``n`` rows of ``req`` from ``start`` (default: what it has computed; the
        pipeline plans from where a queued step leaves it, engine/pipeline_next.py)."""
        if start is None:
            start = req.num_computed_tokens
        if req.prompt_logprobs is None:  # the usual case (every decode): no prompt rows
            return ScheduledSlice(req, start, n, (), start + n == len(req.token_ids))
        first = 0
        last = req.wants_prompt_logprobs_up_to()  # rows < last still need prompt logprobs
        if last:
            first = len(req.prompt_logprobs) - 1  # row p yields entry p + 1
        prompt_rows = tuple(p - start for p in range(max(start, first), min(start + n, last)))
        return ScheduledSlice(req, start, n, prompt_rows, start + n == req.num_tokens)

    def _cap(self, n: int, budget: int) -> int:
        cap = self.config.chunk_cap
        return min(n, budget, cap) if cap is not None else min(n, budget)

    def schedule(self) -> StepPlan:
        while True:
            slices = self._plan_once()
            if slices or not self.running:
                return StepPlan(tuple(slices))
            # Every running request is a prefill blocked on pages: make room.
            self._preempt(self.running[-1])

    def _plan_once(self) -> list[ScheduledSlice]:
        budget = self.config.token_budget
        slices: list[ScheduledSlice] = []
        alloc = self.allocator
        # 1. Decodes. Victims come from the tail of `running`, which this loop has not
        #    reached yet, so no already-scheduled request is ever preempted.
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING or req.num_remaining != 1:
                continue
            while not req.page_table.grow(alloc, req.num_computed_tokens + 1):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if req.status is RequestStatus.RUNNING:
                slices.append(self._slice(req, 1))
                budget -= 1
        # 2. Running prefills: as much as budget, cap and free pages allow.
        for req in self.running:
            if budget == 0:
                break
            if req.num_remaining <= 1:
                continue
            sl = self.prefill_slice(req, req.num_computed_tokens, budget)
            if sl is not None:
                slices.append(sl)
                budget -= sl.length
        self.admit(budget, slices)
        return slices

    def prefill_slice(self, req: Request, start: int, budget: int) -> ScheduledSlice | None:
        """The next prefill slice of a running request from ``start``: as long as budget,
        chunk cap and free pages allow (None: no page is free). Grows its page table."""
        alloc = self.allocator
        room = (len(req.page_table) + alloc.num_free) * PAGE_SIZE - start
        n = min(self._cap(len(req.token_ids) - start, budget), room)
        if n <= 0:
            return None
        req.page_table.grow(alloc, start + n)
        return self._slice(req, n, start)

    def admit(self, budget: int, slices: list[ScheduledSlice]) -> int:
        """Admit waiting requests in FIFO order while ``budget`` and ``max_running`` allow and
        pages exist for their whole next slice (the first that does not fit stops it),
        appending their slices; returns the budget left. Cached leading pages are mapped,
        not computed: only the pages still needed count. A request whose next pages a
        running request is filling is passed over until they are published."""
        alloc = self.allocator
        cache, filling = alloc.cache, self.filling
        i = 0
        while i < len(self.waiting) and budget > 0 and \
                len(self.running) < self.config.max_running:
            req = self.waiting[i]
            cached = cache is not None and req.use_cache
            hits: list[int] = []
            if cached:
                if filling is not None and filling.waits(req.waits_on):
                    i += 1  # still being filled: no new lookup
                    continue
                hits = cache.match(req.token_ids, req.cache_salt, req.chain)
                if filling is not None:
                    req.waits_on = filling.blocker(req, len(hits))
                    if req.waits_on is not None:
                        cache.stats.fill_waits += 1
                        i += 1
                        continue
            done = len(hits) * PAGE_SIZE
            n = self._cap(len(req.token_ids) - done, budget)
            unowned = alloc.count_free(hits)  # they leave the free queue
            if not alloc.can_allocate(pages_for(done + n) - len(hits) + unowned):
                break
            del self.waiting[i]
            if cached:
                cache.record(hits)
                alloc.take_all(hits)
                if req.num_preemptions == 0:
                    req.num_cached_tokens = done
                if filling is not None:
                    filling.claim(req, len(hits))
            req.page_table.pages = hits
            req.num_computed_tokens = done
            req.num_published = len(hits)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            req.page_table.grow(alloc, done + n)
            slices.append(self._slice(req, n))
            budget -= n
        return budget
