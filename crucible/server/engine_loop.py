"""The server's view of the engine: AsyncLLMEngine plus what serving needs on top.

``crucible.engine.async_engine.AsyncLLMEngine`` owns the worker thread: it applies adds and
aborts before each step, refuses at once when the waiting queue is full, and ends every
live request with the exception when a step raises. This thin adapter adds, on the event
loop side only:
- one pump task per request that moves deltas from the engine's queue into a
  ``RequestStream``, stamped with their arrival time (TTFT / inter-token metrics);
- queue and page-use peaks for /metrics, sampled at each submission, at each refusal and
  at most once per millisecond while deltas arrive (a step delivers all its deltas at once);
  requests accepted but not yet handed to the scheduler (the worker is mid-step) count as
  waiting, as they do for the queue bound.
  The scheduler re-queues preempted requests at the head of the waiting queue, beyond the
  bound if need be (they were accepted already), so two peaks are kept: new requests
  waiting (never above the bound) and all waiting requests;
- health: after a failed step, once no request is live, every page must be free again;
  if not, the pool can no longer be trusted and the loop reports unhealthy (503).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Sequence

from crucible.engine.async_engine import AsyncLLMEngine
from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.engine.sampling import SamplingParams
from crucible.errors import QueueFullError, RequestError
from crucible.server.stream import EngineFailure, RequestStream

log = logging.getLogger("crucible.server")


class EngineUnavailable(Exception):
    """The engine loop has stopped or is unhealthy; requests get 503."""


class EngineLoop:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.async_engine = AsyncLLMEngine(engine)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pumps: set[asyncio.Task] = set()
        self._ids = 0
        self._stopped = False
        self.healthy = True
        self.unhealthy_reason = ""
        self.num_failures = 0  # failed requests seen (each failed step fails >= 1)
        self.queue_peak = 0  # new (never admitted) requests waiting: <= the bound
        self.waiting_peak = 0  # all waiting requests, preempted ones included
        self.pages_peak = 0
        self._last_sample = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # the worker thread itself starts with the first request

    async def stop(self) -> None:
        self._stopped = True
        await self.async_engine.shutdown()

    @property
    def running(self) -> bool:
        return not self._stopped and self.healthy

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    @property
    def stats(self) -> dict[str, Any]:
        return self._sample()

    def _sample(self) -> dict[str, Any]:
        # Plain reads of ints/lengths owned by the worker: a monitoring snapshot, not a lock.
        self._last_sample = time.monotonic()
        st: dict[str, Any] = dict(self.engine.stats())
        used = st["pages_total"] - st["pages_free"]
        preempted = self._preempted_waiting()
        # Accepted adds the worker has not moved into the scheduler yet (it is inside a
        # step) wait too: the queue bound counts them, so the peaks must as well.
        pending = self.async_engine.num_pending
        waiting = st["waiting"] + pending
        self.pages_peak = max(self.pages_peak, used)
        self.waiting_peak = max(self.waiting_peak, waiting)
        self.queue_peak = max(self.queue_peak, waiting - preempted)
        st.update(pages_used=used, queue_peak=self.queue_peak, pages_peak=self.pages_peak,
                  waiting_preempted=preempted, waiting_peak=self.waiting_peak,
                  failures=self.num_failures)
        return st

    def _preempted_waiting(self) -> int:
        for _ in range(3):  # copying the deque races with the worker; retry, then give up
            try:
                return sum(1 for r in list(self.engine.scheduler.waiting) if r.num_preemptions)
            except RuntimeError:
                continue
        return 0

    async def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                     request_id: str, cache_salt: str | None = None) -> RequestStream:
        """Queue one request; raises QueueFullError / RequestError at once, as the engine does."""
        if not self.running:
            raise EngineUnavailable(self.unhealthy_reason or "the engine is not running")
        try:
            rid, queue = self.async_engine.add(prompt_token_ids, params, request_id, cache_salt)
        except QueueFullError:
            self._sample()  # a refusal is when the queue is fullest: count it in the peak
            raise
        stream = RequestStream(rid, list(prompt_token_ids), params)
        self._sample()  # the new request is counted once the worker has queued it
        task = asyncio.get_running_loop().create_task(self._pump(queue, stream))
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (no-op if it already ended); takes effect before the next step."""
        self.async_engine.abort(request_id)

    async def _pump(self, queue: asyncio.Queue, stream: RequestStream) -> None:
        while True:
            item: RequestDelta | BaseException = await queue.get()
            if isinstance(item, (QueueFullError, RequestError)):
                stream.fail(EngineFailure(str(item), cause=item))  # refused, not a fault
                return
            if isinstance(item, BaseException):
                self._on_failure(item)
                stream.fail(EngineFailure(f"the engine failed: {type(item).__name__}: {item}",
                                          cause=item))
                return
            now = time.monotonic()
            stream.put(item, now)
            if now - self._last_sample > 1e-3:
                self._sample()
            if item.finished:
                return

    def _on_failure(self, exc: BaseException) -> None:
        self.num_failures += 1
        log.error("engine step failed: %r", exc)
        if self._loop is not None:
            self._loop.call_later(0.2, self._check_pool)

    def _check_pool(self) -> None:
        """After a failure and once idle, every page must have come back."""
        if self.engine.has_unfinished():
            return  # new work already runs; the next failure (if any) checks again
        alloc = self.engine.allocator
        if alloc.num_free != alloc.num_pages:
            self.healthy = False
            self.unhealthy_reason = (f"after a failed step {alloc.num_pages - alloc.num_free} "
                                     f"pages are unaccounted for")
            log.error("marking unhealthy: %s", self.unhealthy_reason)
