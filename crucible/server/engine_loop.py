"""The engine loop: one worker thread owns the LLMEngine; the event loop talks to it by message.

Why a command queue and not a lock: the engine is not thread-safe, and a lock held for a
whole step would let the stepping thread re-acquire it ahead of waiting adders (Python
locks are not fair). Instead the event loop posts ``add``/``abort`` commands; the worker
drains them between steps, in arrival order, so
- a request is accepted or refused (QueueFullError -> 429) within one step, and the
  waiting-queue bound is applied exactly in arrival order;
- an abort (client disconnect) frees the request's pages before the next step.
Deltas of one step go back to the event loop in one ``call_soon_threadsafe`` and are fanned
out to per-request ``RequestStream`` queues. A step that raises fails every in-flight request
(each stream ends with ``EngineFailure``; nothing hangs), their pages are released, and the
loop keeps serving; if pages cannot be accounted for afterwards the loop reports unhealthy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.engine.sampling import SamplingParams
from crucible.server.stream import EngineFailure, RequestStream

log = logging.getLogger("crucible.server")


@dataclass(frozen=True)
class _Add:
    stream: RequestStream
    future: concurrent.futures.Future


@dataclass(frozen=True)
class _Abort:
    request_id: str


class EngineUnavailable(Exception):
    """The engine loop has stopped or is unhealthy; requests get 503."""


class EngineLoop:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # touched only by the worker thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ids = 0
        self.healthy = True
        self.unhealthy_reason = ""
        self.num_failures = 0  # steps that raised
        self.queue_peak = 0
        self.pages_peak = 0
        self.stats: dict[str, int] = dict(engine.stats())

    # -- event-loop side ------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="crucible-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._commands.put(None)
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.healthy

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    async def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                     request_id: str) -> RequestStream:
        """Queue one request; raises QueueFullError / RequestError as the engine does."""
        if not self.running:
            raise EngineUnavailable(self.unhealthy_reason or "the engine is not running")
        stream = RequestStream(request_id, list(prompt_token_ids), params)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_Add(stream, fut))
        await asyncio.wrap_future(fut)
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (no-op if it already ended); takes effect before the next step."""
        self._commands.put(_Abort(request_id))

    # -- worker thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                block = not self.engine.has_unfinished()
                if not self._drain(block):
                    break
                if self.engine.has_unfinished():
                    self._step()
                self._snapshot()
        except Exception as exc:  # a bug in the loop itself: fail loudly, never hang
            log.exception("engine loop crashed")
            self.healthy = False
            self.unhealthy_reason = f"engine loop crashed: {exc!r}"
            self._fail_all(exc)
        finally:
            self._fail_all(EngineUnavailable("the engine loop stopped"))

    def _drain(self, block: bool) -> bool:
        """Run pending commands (waiting for one when idle); False on shutdown."""
        try:
            cmd = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd is None:
                return False
            if isinstance(cmd, _Add):
                self._add(cmd)
            else:
                self._abort(cmd.request_id)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, cmd: _Add) -> None:
        s = cmd.stream
        try:
            self.engine.add_request(s.prompt_token_ids, s.params, request_id=s.request_id)
        except Exception as exc:
            cmd.future.set_exception(exc)
            return
        self._streams[s.request_id] = s
        cmd.future.set_result(None)
        self._snapshot()  # the queue peak is seen right after admission, not a step later

    def _abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if self.engine.abort(request_id) and stream is not None:
            self._deliver([(stream, RequestDelta(request_id, (), "", None, None, True, "abort"))])

    def _step(self) -> None:
        try:
            deltas = self.engine.step()
        except Exception as exc:
            self.num_failures += 1
            log.exception("engine step failed; failing %d in-flight requests",
                          len(self.engine.requests))
            self._recover(exc)
            return
        out = []
        for d in deltas:
            stream = self._streams.get(d.request_id)
            if d.finished:
                self._streams.pop(d.request_id, None)
            if stream is not None:
                out.append((stream, d))
        self._deliver(out)

    def _recover(self, exc: Exception) -> None:
        for rid in list(self.engine.requests):
            self.engine.abort(rid)  # releases the request's pages
        self._fail_all(exc)
        alloc = self.engine.allocator
        if alloc.num_free != alloc.num_pages:
            self.healthy = False
            self.unhealthy_reason = (f"after a failed step {alloc.num_pages - alloc.num_free} "
                                     f"pages are unaccounted for")

    def _fail_all(self, exc: BaseException) -> None:
        streams, self._streams = list(self._streams.values()), {}
        if streams and self._loop is not None and not self._loop.is_closed():
            err = EngineFailure(str(exc) or type(exc).__name__)
            self._loop.call_soon_threadsafe(lambda: [s.fail(err) for s in streams])

    def _deliver(self, items: list[tuple[RequestStream, RequestDelta]]) -> None:
        if not items or self._loop is None or self._loop.is_closed():
            return
        now = time.monotonic()
        self._loop.call_soon_threadsafe(lambda: [s.put(d, now) for s, d in items])

    def _snapshot(self) -> None:
        st: dict[str, Any] = self.engine.stats()
        used = st["pages_total"] - st["pages_free"]
        self.queue_peak = max(self.queue_peak, st["waiting"])
        self.pages_peak = max(self.pages_peak, used)
        st.update(pages_used=used, queue_peak=self.queue_peak, pages_peak=self.pages_peak,
                  failures=self.num_failures)
        self.stats = st  # one reference assignment: readers see a whole snapshot
