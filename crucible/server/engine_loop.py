"""The in-process engine for the server: AsyncLLMEngine plus what serving needs on top
(``llm-engine serve --engine-in-process``, tests, embedding; the default runs the engine in
its own process, engine_client.py). It implements serving_engine.ServingEngine.

``crucible.engine.async_engine.AsyncLLMEngine`` owns the worker thread: it applies adds and
aborts before each step, refuses at once when the waiting queue is full, and ends every
live request with the exception when a step raises. This thin adapter adds, on the event
loop side only:
- one pump task per request that moves deltas from the engine's queue into a
  ``RequestStream``, stamped with their arrival time (TTFT / inter-token metrics);
- queue and page-use peaks for /metrics (serving_engine.LoadPeaks), sampled at each
  submission, at each refusal and at most once per millisecond while deltas arrive (a step
  delivers all its deltas at once);
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
from crucible.server.serving_engine import EngineUnavailable, LoadPeaks
from crucible.server.stream import EngineFailure, RequestStream

log = logging.getLogger("crucible.server")
__all__ = ["EngineLoop", "EngineUnavailable"]


class EngineLoop:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.async_engine = AsyncLLMEngine(engine)
        self.tokenizer = engine.tokenizer
        self.max_context = engine.max_context
        self.num_pages = engine.allocator.num_pages
        self.max_queue = engine.config.max_queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pumps: set[asyncio.Task] = set()
        self._ids = 0
        self._stopped = False
        self.healthy = True
        self.unhealthy_reason = ""
        self.other_fronts: list = []  # one front always: it shares its engine with none
        self.num_failures = 0  # failed requests seen (each failed step fails >= 1)
        self.peaks = LoadPeaks()
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

    @property
    def num_pending(self) -> int:
        return self.async_engine.num_pending

    async def fresh_stats(self) -> dict[str, Any]:
        return self._sample()  # read in place: always current

    def _sample(self) -> dict[str, Any]:
        # Plain reads of ints/lengths owned by the worker: a monitoring snapshot, not a lock.
        self._last_sample = time.monotonic()
        return self.peaks.sample(dict(self.engine.stats()), self.async_engine.num_pending,
                                 self._preempted_waiting(), self.num_failures)

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
