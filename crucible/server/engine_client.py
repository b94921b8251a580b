"""The engine in a process of its own, seen from the server: ``EngineClient``.

The default for ``llm-engine serve`` (vLLM v1 and SGLang split serving the same way): the
aiohttp front tokenises, detokenises and writes JSON/SSE for every client, while the
engine-core process (crucible/engine/core_process.py) only schedules and steps, so HTTP
work never competes with the step loop for one GIL. Token ids cross the pipe, never text.

The event loop submits: the request is checked against the engine's limits and the queue
bound at once, as the in-process engine does, then its add goes to the link's writer
thread (core_link.py). The link's reader thread decodes each step frame, detokenises it
(front_output.py) and hands the step's deltas to the loop with one
``call_soon_threadsafe``. When the process dies, every live request ends with an error
naming its exit code, and the client stays unhealthy (503) from then on.
(Several fronts over one engine process: server/fronts.py's ``FrontsClient``.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

from crucible.engine import core_wire as wire
from crucible.engine.engine import RequestDelta
from crucible.engine.sampling import SamplingParams
from crucible.errors import QueueFullError, RequestError
from crucible.server.core_link import CoreLink, EngineLoadError, EngineProcessConfig
from crucible.server.front_output import FrontOutput
from crucible.server.serving_engine import EngineLimits, EngineUnavailable, LoadPeaks
from crucible.server.stream import EngineFailure, EngineGone, RequestStream

log = logging.getLogger("crucible.server")


class _Live(NamedTuple):
    stream: RequestStream
    output: FrontOutput  # fed by the reader thread only


class EngineClient:
    def __init__(self, config: EngineProcessConfig | None, fronts: int = 1) -> None:
        self.config = config  # None: attached to a process another front spawned
        self.fronts = fronts  # pipes the process gets (server/fronts.py)
        self.other_fronts: list[dict[str, Any]] = []  # their metrics (server/fronts.py)
        self.tokenizer: Any = None  # all of these come with the ready message
        self.max_context = self.num_pages = self.max_queue = 0
        self.pid: int | None = None
        self.healthy = True
        self.unhealthy_reason = ""
        self.num_failures = 0
        self.peaks = LoadPeaks()
        self._limits: EngineLimits | None = None
        self._counters: dict[str, int] = dict.fromkeys(wire.STATS_KEYS, 0)
        self._live: dict[int, _Live] = {}  # handle -> request; the reader removes ended ones
        self._by_rid: dict[str, int] = {}
        self._lock = threading.Lock()  # guards the two maps (loop and reader both use them)
        self._handles = itertools.count(1)
        self._qids = itertools.count(1)
        self._queries: dict[int, asyncio.Future] = {}
        self._ids = self._adds_sent = 0
        self._stopped = self._exited = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._handlers = {wire.STEP: self._on_step, wire.READY: self._on_ready,
                          wire.LOAD_FAILED: self._on_load_failed,
                          wire.REFUSED: self._on_refused, wire.FAILED: self._on_failed,
                          wire.STATS_REPLY: self._on_stats}
        self._link = CoreLink(self._on_frame, self._on_link_exit)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> dict[str, Any]:
        """Spawn the process; return its EngineInfo (as a dict) once the engine is built.
        Raises EngineLoadError when the build fails, EngineGone when the process dies."""
        loop = self._loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        await loop.run_in_executor(None, self._link.start, self.config, self.fronts)
        self.pid = self._link.pid
        return await self._ready

    async def stop(self) -> None:
        """Tell the process to stop (live requests end as aborted), wait for it, then
        terminate it if it did not exit in time (at once while it is still loading)."""
        if self._stopped:
            return
        self._stopped = True
        if self._loop is None:
            return  # never started
        loading = self._ready is None or not self._ready.done()
        if not loading:
            self._link.send(bytes([wire.SHUTDOWN]))
        timeout = self.config.stop_timeout if self.config is not None else 10.0
        await asyncio.to_thread(self._link.finish, 0.0 if loading else timeout)
        await asyncio.sleep(0)  # let the reader's last hand-off run

    # -- the serving surface (serving_engine.ServingEngine) --------------------------------
    @property
    def running(self) -> bool:
        return self._limits is not None and not (self._stopped or self._exited) \
            and self.healthy

    @property
    def num_pending(self) -> int:
        return self._adds_sent - self._counters["adds_seen"]

    @property
    def stats(self) -> dict[str, Any]:
        c: dict[str, Any] = dict(self._counters)
        return self.peaks.sample(c, self.num_pending, c.pop("waiting_preempted"),
                                 self.num_failures)

    async def fresh_stats(self) -> dict[str, Any]:
        """The engine's counters as of now: it answers after every message sent before."""
        if not self.running:
            return self.stats
        qid = next(self._qids)
        fut = self._queries[qid] = asyncio.get_running_loop().create_future()
        self._link.send(bytes([wire.STATS]) + qid.to_bytes(4, "little"))
        try:
            self._counters = await asyncio.wait_for(fut, 30.0)
        finally:
            self._queries.pop(qid, None)
        return self.stats

    def next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-{self._ids}"

    async def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                     request_id: str, cache_salt: str | None = None) -> RequestStream:
        if not self.running or self._limits is None:
            raise EngineUnavailable(self.unhealthy_reason or "the engine is not running")
        self._limits.check_request(prompt_token_ids, params)
        if request_id in self._by_rid:
            raise RequestError(f"request id {request_id!r} is already in use")
        if self._counters["waiting"] + self.num_pending >= self.max_queue:
            self.stats  # a refusal is when the queue is fullest: count it in the peak
            raise QueueFullError(f"waiting queue is full ({self.max_queue} requests); "
                                 f"retry later")
        handle = next(self._handles) & 0xFFFFFFFF
        ids = [int(t) for t in prompt_token_ids]
        stream = RequestStream(request_id, ids, params)
        with self._lock:
            self._live[handle] = _Live(stream, FrontOutput(request_id, params, self.tokenizer))
            self._by_rid[request_id] = handle
        self._adds_sent += 1
        self._link.send(wire.encode_add(handle, request_id, ids, params, cache_salt=cache_salt))
        self.stats  # noqa: B018 - samples the peaks with this request counted
        return stream

    def abort(self, request_id: str) -> None:
        handle = self._by_rid.get(request_id)
        if handle is not None:
            self._link.send(wire.encode_abort([handle]))

    # -- on the link's reader thread ------------------------------------------------------
    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _on_frame(self, frame: bytes) -> None:
        try:
            self._handlers[frame[0]](frame)
        except Exception:  # a bad frame must not silence every later one
            log.exception("cannot read a message from the engine process")

    def _on_link_exit(self, reason: str) -> None:
        self._call(self._on_exit, reason)

    def _take(self, handles: Sequence[int]) -> list[_Live]:
        with self._lock:
            out = [self._live.pop(h, None) for h in handles]
            for e in out:
                if e is not None:
                    self._by_rid.pop(e.stream.request_id, None)
        return [e for e in out if e is not None]

    def _on_step(self, data: bytes) -> None:
        counters, deltas = wire.decode_step(data)
        live = self._live
        with self._lock:
            pairs = [(w, live.get(w.handle)) for w in deltas]
        ended = [w.handle for w in deltas if w.finish_reason is not None]
        if ended:
            self._take(ended)
        items, cut = [], []
        for w, entry in pairs:  # only this thread feeds outputs: no lock while decoding
            if entry is None:
                continue
            delta, stopped_here = entry.output.feed(w)
            if delta is not None:
                items.append((entry.stream, delta))
            if stopped_here:
                cut.append(w.handle)
        if cut:  # stop strings ended these here: the engine need not run them on
            self._link.send(wire.encode_abort(cut))
        self._call(self._deliver, items, counters)

    def _on_ready(self, data: bytes) -> None:
        msg = wire.decode_json(data)
        tok = wire.tokenizer_from_payload(msg["tokenizer"])  # parsed here, off the loop
        self._call(self._set_ready, msg, tok)

    def _on_load_failed(self, data: bytes) -> None:
        msg = wire.decode_json(data)
        self._call(self._fail_ready, EngineLoadError(msg["error"], msg["expected"],
                                                     msg["traceback"]))

    def _on_refused(self, data: bytes) -> None:
        msg = wire.decode_json(data)
        kind, text = msg["kind"], msg["message"]
        cause: BaseException | None = (QueueFullError(text) if kind == "queue_full" else
                                       RequestError(text) if kind == "request" else None)
        err = EngineFailure(text if cause else f"the engine failed: {text}", cause=cause)
        items = [(e.stream, err) for e in self._take([msg["handle"]])]
        if cause is None:
            self._call(self._count_failures, text, items)
        self._call(self._deliver, items, None)

    def _on_failed(self, data: bytes) -> None:
        msg = wire.decode_json(data)
        err = EngineFailure(f"the engine failed: {msg['error']}")
        items = [(e.stream, err) for e in self._take(msg["handles"])]
        self._call(self._count_failures, msg["error"], items, msg["leaked_pages"])
        self._call(self._deliver, items, msg["stats"])

    def _on_stats(self, data: bytes) -> None:
        msg = wire.decode_json(data)
        self._call(self._answer, msg["qid"], msg["stats"])

    # -- on the event loop -----------------------------------------------------------------
    def _deliver(self, items: list[tuple[RequestStream, Any]],
                 counters: dict[str, int] | None) -> None:
        now = time.monotonic()
        for stream, item in items:
            if isinstance(item, EngineFailure):
                stream.fail(item)
            else:
                stream.put(item, now)
        if counters is not None:
            self._counters = counters
            self.stats  # noqa: B018 - samples the peaks at every step

    def _count_failures(self, error: str, items: list, leaked: int = 0) -> None:
        self.num_failures += len(items)
        log.error("engine step failed: %s", error)
        if leaked and self.healthy:
            self.healthy = False
            self.unhealthy_reason = f"after a failed step {leaked} pages are unaccounted for"
            log.error("marking unhealthy: %s", self.unhealthy_reason)

    def _answer(self, qid: int, stats: dict[str, int]) -> None:
        fut = self._queries.get(qid)
        if fut is not None and not fut.done():
            fut.set_result(stats)

    def _set_ready(self, msg: dict[str, Any], tok: Any) -> None:
        self.tokenizer = tok
        self.max_context, self.num_pages = msg["max_context"], msg["num_pages"]
        self.max_queue = msg["max_queue"]
        self._limits = EngineLimits(msg["max_context"], msg["vocab_size"], msg["num_pages"])
        self._counters = dict(msg["stats"])  # until the first step's frame
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(msg["info"])

    def _fail_ready(self, exc: BaseException) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(exc)

    def _on_exit(self, reason: str) -> None:
        # On the loop, so no submit can slip in between taking the live requests and
        # ``running`` turning False (the reader has stopped feeding them).
        self._exited = True
        with self._lock:
            entries = list(self._live.values())
            self._live.clear()
            self._by_rid.clear()
        if not self._stopped:
            self.healthy = False
            self.unhealthy_reason = reason
            log.error("%s", reason)
        now = time.monotonic()
        for e in entries:
            if self._stopped:  # shut down on purpose: what still ran ends as aborted
                rid = e.stream.request_id
                e.stream.put(RequestDelta.aborted(rid), now)
            else:
                e.stream.fail(EngineFailure(reason, cause=EngineGone(reason)))
        for fut in self._queries.values():
            if not fut.done():
                fut.set_exception(EngineUnavailable(reason))
        self._fail_ready(EngineGone(reason + " while loading"))
