"""AsyncLLMEngine: asyncio streaming on top of LLMEngine, steps run in one worker thread.

The event loop never runs a step. ``generate`` registers the request (refusing at once with
QueueFullError or RequestError), then yields ``RequestDelta`` increments as the worker
produces them. The worker is the only thread that touches the LLMEngine: adds and aborts
are handed to it through small lock-protected lists and applied before the next step, so an
abort frees the request's pages before any further step runs. Leaving the async iterator
early (client disconnect, ``break``, task cancellation) aborts the request. After a step,
while the device still runs the step queued ahead, the worker lets the loops run the tasks
its deltas woke, so a request a client sends in answer joins the next step
(``_await_replies``). While an AsyncLLMEngine is live, drive its LLMEngine only through it
(not LLM.generate as well).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import AsyncIterator, Sequence

from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.engine.sampling import SamplingParams
from crucible.errors import QueueFullError, RequestError


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._adds: list[tuple[str, list[int], SamplingParams]] = []
        self._aborts: list[str] = []
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = False
        self._thread: threading.Thread | None = None
        if engine.pacer is not None:  # late planning takes arrivals in while a step runs
            engine.pacer.arrivals = self._apply_pending

    # -- called from the event loop ----------------------------------------------------
    def add(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
            request_id: str | None = None,
            cache_salt: str | None = None) -> tuple[str, asyncio.Queue]:
        """Register a request; raises at once if it is invalid or the queue is full.
        ``cache_salt``: it shares prefix-cache pages only with requests of the same salt."""
        params = params or SamplingParams()
        # Checked and converted in one go (reads immutable config only); the worker takes
        # the ids as they are, unchecked (add_request's ``checked``).
        ids = self.engine.checked_ids(prompt_token_ids, params)
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if rid in self._streams:
                raise RequestError(f"request id {rid!r} is already in use")
            # len() of the scheduler's deque is a benign racy read; the worker re-checks.
            if len(self.engine.scheduler.waiting) + len(self._adds) >= self.engine.config.max_queue:
                raise QueueFullError(f"waiting queue is full ({self.engine.config.max_queue} "
                                     f"requests); retry later")
            self._streams[rid] = (asyncio.get_running_loop(), queue)
            self._adds.append((rid, ids, params, cache_salt))
        self._ensure_worker()
        self._wake.set()
        return rid, queue

    @property
    def num_pending(self) -> int:
        """Accepted requests the worker has not moved into the scheduler yet (a racy read,
        for monitoring: the queue bound counts them)."""
        return len(self._adds)

    def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
                 request_id: str | None = None) -> AsyncIterator[RequestDelta]:
        """Register now (so a refusal raises here, at once) and stream the increments."""
        rid, queue = self.add(prompt_token_ids, params, request_id)
        return self._stream(rid, queue)

    async def _stream(self, rid: str, queue: asyncio.Queue) -> AsyncIterator[RequestDelta]:
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        """Ask the worker to end the request before its next step (idempotent)."""
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    async def shutdown(self) -> None:
        """Stop the worker; requests still live are aborted (their pages returned)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        with self._lock:
            self._adds.clear()
        for rid in list(self.engine.requests):  # the worker is gone: safe on this thread
            self.engine.abort(rid)
            self._push(rid, RequestDelta.aborted(rid), True)
        for rid in list(self._streams):
            self._push(rid, RequestDelta.aborted(rid), True)

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    # -- the worker thread ---------------------------------------------------------------
    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop = False  # after a shutdown, a new request starts the worker again
            self._thread = threading.Thread(target=self._run, name="crucible-engine", daemon=True)
            self._thread.start()

    def _push(self, rid: str, item: RequestDelta | BaseException, last: bool) -> None:
        self._push_all([(rid, item, last)])

    def _push_all(self, items: list[tuple[str, RequestDelta | BaseException, bool]]
                  ) -> list[threading.Event]:
        """Hand each item to its request's queue: one lock and one wake-up of each event
        loop for a whole step's deltas (a call_soon_threadsafe each cost the worker ~5 us
        a request between two steps), in order. Returns an event per loop, set once the
        tasks those items woke have run (``_await_replies``)."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        with self._lock:
            pop, get = self._streams.pop, self._streams.get
            for rid, item, last in items:
                entry = pop(rid, None) if last else get(rid)
                if entry is not None:
                    by_loop.setdefault(entry[0], []).append((entry[1], item))
        acks = []
        for loop, puts in by_loop.items():
            ack = threading.Event()
            try:
                loop.call_soon_threadsafe(_put_all, puts, ack)
            except RuntimeError:  # that event loop is closed: nobody is listening any more
                continue
            acks.append(ack)
        return acks

    def _await_replies(self, acks: list[threading.Event]) -> None:
        """Give the event loops their turn with a step's deltas before the next step is
        planned, for as long as the device is still busy with the step queued ahead.

        Why: a client that answers a finished request with its next one (a chat turn, an
        agent's call) does so on its loop, and only a request the worker has taken in by
        the time it plans joins the next step. Planned at once, the pipelined worker had
        the GIL until it blocked on the device, so those arrivals waited a whole step
        more: one wake-up a step instead of one a request made the cached chat TTFT p50
        1.17x and the uncached 1.05x on an H100 (bench/push-all-revert-chat-ab-h100.json;
        a wake-up a request let the loop in only by chance, at its system calls). With
        this wait, against a wake-up a request: cached 0.915x, uncached 0.962x, tok/s
        1.086x (bench/reply-wait-chat-ab-h100.json). The wait ends when the device has
        nothing left to run, so it never idles it for longer than a poll and the planning
        it waited to do (docs/engine.md)."""
        engine = self.engine
        for ack in acks:
            while not ack.wait(_REPLY_POLL_S):
                if not engine.device_busy():
                    return

    def _apply_pending(self) -> None:
        failed: list[tuple[str, BaseException]] = []
        # Adds move into the engine under the lock, so add()'s queue-bound check always
        # sees each request either pending or waiting, never neither.
        with self._lock:
            adds, self._adds = self._adds, []
            aborts, self._aborts = set(self._aborts), []
            for rid, prompt, params, salt in adds:
                if rid in aborts:
                    continue  # aborted before it ever reached the engine
                try:
                    self.engine.add_request(prompt, params, request_id=rid, cache_salt=salt,
                                            checked=True)  # add() checked it
                except Exception as e:  # a duplicate id, a race on the queue bound...
                    failed.append((rid, e))
        for rid, e in failed:
            self._push(rid, e, True)
        for rid, *_ in adds:
            if rid in aborts:
                aborts.discard(rid)
                self._push(rid, RequestDelta.aborted(rid), True)
        for rid in aborts:
            if self.engine.abort(rid):
                self._push(rid, RequestDelta.aborted(rid), True)

    def _run(self) -> None:
        while not self._stop:
            self._apply_pending()
            if not self.engine.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                deltas = self.engine.step()
            except Exception as e:  # a backend failure ends every live request, not the loop
                for rid in list(self.engine.requests):
                    self.engine.abort(rid)
                    self._push(rid, e, True)
                continue
            acks = self._push_all([(d.request_id, d, d.finished) for d in deltas])
            if acks and self.engine.device_busy():
                self._await_replies(acks)


_REPLY_POLL_S = 0.0002  # how often a waiting worker checks whether the device is done


def _put_all(puts: list[tuple[asyncio.Queue, RequestDelta | BaseException]],
             ack: threading.Event) -> None:
    for queue, item in puts:
        queue.put_nowait(item)
    # Queued behind the wake-ups of the tasks these items woke: set once they have run.
    asyncio.get_running_loop().call_soon(ack.set)
