"""The engine-core process: the LLMEngine (scheduler, page pool, device) in a process of
its own, driven over one pipe by the server's front (crucible/server/engine_client.py).

The front spawns it with the model spec and Settings it was given; the engine is built
here with the same factory, so the same flags give the same engine as in-process serving.
Then it loops: take in every waiting message (adds, aborts, stats queries, shutdown), run
one step when there is work, send one frame for that step with every request's delta
(core_wire.py). Only token ids cross: the engine does not detokenise
(``LLMEngine.detokenize``), the front does, with the same code. The process exits when
told to, when the pipe reaches EOF, or when its parent is gone (checked from a thread as
well, so a front killed mid-load or mid-step leaves no orphan).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from multiprocessing.connection import Connection
from typing import Any

from crucible.engine import core_wire as wire
from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.engine.factory import freeze_startup
from crucible.engine.settings import Settings
from crucible.errors import CrucibleError, QueueFullError, RequestError

DEFAULT_FACTORY = "crucible.engine.factory:build_engine"


def core_main(conn: Connection, model: str, settings: Settings, factory: str,
              parent_pid: int) -> None:
    """The spawned process's entry point (module level, so spawn can import it)."""
    # Ctrl-C reaches the whole process group; the front decides when this process stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(parent_pid)
    try:
        module, _, name = factory.partition(":")
        build = getattr(importlib.import_module(module), name)
        engine, info = build(model, settings)
        engine.detokenize = False
    except BaseException as exc:  # noqa: BLE001 - every load failure is reported, then exit
        _send(conn, wire.encode_json(wire.LOAD_FAILED, {
            "error": f"{type(exc).__name__}: {exc}",
            "expected": isinstance(exc, CrucibleError),
            "traceback": traceback.format_exc()}))
        return
    freeze_startup()  # this process serves one engine for its whole life
    core = EngineCore(engine, conn)
    # The counters go with it, so /metrics shows the pool before the first step.
    ready = {"info": asdict(info), "max_context": engine.max_context,
             "vocab_size": engine.vocab_size, "num_pages": engine.allocator.num_pages,
             "max_queue": engine.config.max_queue, "pid": os.getpid(),
             "tokenizer": wire.tokenizer_payload(engine.tokenizer),
             "stats": dict(zip(wire.STATS_KEYS, core.counters()))}
    if _send(conn, wire.encode_json(wire.READY, ready)):
        core.run(settings.core_profile)


def _watch_parent(parent_pid: int) -> None:
    """Exit when the front is gone, even while loading or inside a long step (the pipe's
    EOF is only seen between steps)."""
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="crucible-core-watch", daemon=True).start()


def _send(conn: Connection, data: bytes) -> bool:
    try:
        conn.send_bytes(data)
        return True
    except OSError:  # the front is gone
        return False


class EngineCore:
    """The loop over one engine: messages in, one frame per step out."""

    def __init__(self, engine: LLMEngine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.handles: dict[str, int] = {}  # live request id -> the front's handle
        self.rids: dict[int, str] = {}  # and back
        self.adds_seen = 0
        self.stopping = False
        # What late planning (engine/pacing.py) drains while a step runs, sent with its frame.
        self._ended: list[tuple[int, RequestDelta]] = []
        self._changed = False
        if engine.pacer is not None:
            engine.pacer.arrivals = self._arrivals

    def run(self, profile: Path | None = None) -> None:
        """The loop; ``profile`` (Settings.core_profile): run it under cProfile."""
        prof = None if profile is None else _Profile(str(profile))
        try:
            self._loop(prof)
        finally:
            if prof is not None:
                prof.dump()

    def _loop(self, prof: "_Profile | None") -> None:
        engine = self.engine
        while not self.stopping:
            if prof is not None:
                prof.tick()
            self._ended = ended = []
            self._changed = False
            changed = self._drain(ended, block=not engine.has_unfinished())
            deltas: list[RequestDelta] = []
            if engine.has_unfinished() and not self.stopping:
                try:
                    deltas = engine.step()
                except Exception as exc:  # a failed step ends every live request, not the loop
                    self._fail_all(exc)
                    continue
            changed = changed or self._changed
            # Without a step, a frame still goes out when adds or aborts changed the counts
            # (an abort frees pages even when nothing runs afterwards).
            if deltas or ended or changed:
                handles, forget = self.handles, self._forget
                out = ended + [(forget(d.request_id) if d.finished
                                else handles[d.request_id], d) for d in deltas]
                if not _send(self.conn, wire.encode_step(out, self.counters())):
                    return

    def _arrivals(self) -> None:
        """Late planning's drain, inside a step: adds and aborts as between steps."""
        if not self.stopping:
            self._changed = self._drain(self._ended, block=False) or self._changed

    def counters(self) -> list[int]:
        st: dict[str, Any] = self.engine.stats()
        st["waiting_preempted"] = sum(1 for r in self.engine.scheduler.waiting
                                      if r.num_preemptions)
        st["adds_seen"] = self.adds_seen
        return [int(st[k]) for k in wire.STATS_KEYS]

    # -- messages --------------------------------------------------------------------------
    def _drain(self, ended: list[tuple[int, RequestDelta]], block: bool) -> bool:
        """Apply every waiting message; True if an add or an abort was among them."""
        conn, changed = self.conn, False
        try:
            if block:
                conn.poll(None)  # idle: sleep until a message (or EOF) arrives
            while conn.poll(0):
                data = conn.recv_bytes()
                kind = data[0]
                if kind == wire.ADD:
                    self._add(data)
                    changed = True
                elif kind == wire.ABORT:
                    for h in wire.decode_abort(data):
                        self._abort(h, ended)
                    changed = True
                elif kind == wire.STATS:
                    qid = int.from_bytes(data[1:5], "little")
                    stats = dict(zip(wire.STATS_KEYS, self.counters()))
                    if not _send(conn, wire.encode_json(wire.STATS_REPLY,
                                                        {"qid": qid, "stats": stats})):
                        self.stopping = True
                        return changed
                elif kind == wire.SHUTDOWN:
                    for h in list(self.handles.values()):
                        self._abort(h, ended)
                    self.stopping = True
                    return True
        except (EOFError, OSError):  # the front closed its end or died
            self.stopping = True
            for rid in list(self.handles):
                self.engine.abort(rid)
                self._forget(rid)
            ended.clear()
        return changed

    def _add(self, data: bytes) -> None:
        handle, ids, meta = wire.decode_add(data)
        self.adds_seen += 1
        rid = meta["rid"]
        try:
            self.engine.add_request(ids, meta["params"], rid, final_only=meta["final_only"],
                                    cache_salt=meta["cache_salt"],
                                    use_prefix_cache=meta["use_prefix_cache"])
        except Exception as exc:  # refused here: the bound raced, or a check the front lacks
            kind = ("queue_full" if isinstance(exc, QueueFullError) else
                    "request" if isinstance(exc, RequestError) else "error")
            if kind == "error":
                traceback.print_exc(file=sys.stderr)
            _send(self.conn, wire.encode_json(wire.REFUSED, {
                "handle": handle, "kind": kind, "message": f"{exc}" if kind != "error"
                else f"{type(exc).__name__}: {exc}"}))
            return
        self.handles[rid] = handle
        self.rids[handle] = rid

    def _forget(self, rid: str) -> int:
        handle = self.handles.pop(rid)
        del self.rids[handle]
        return handle

    def _abort(self, handle: int, ended: list[tuple[int, RequestDelta]]) -> None:
        rid = self.rids.get(handle)
        if rid is None or not self.engine.abort(rid):
            return  # it finished meanwhile: its last delta is already on its way
        self._forget(rid)
        ended.append((handle, RequestDelta(rid, (), "", None, None, True, "abort", 0)))

    def _fail_all(self, exc: Exception) -> None:
        handles = list(self.handles.values())
        for rid in list(self.handles):
            self.engine.abort(rid)
            self._forget(rid)
        alloc = self.engine.allocator
        _send(self.conn, wire.encode_json(wire.FAILED, {
            "handles": handles, "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            # Nothing runs now, so every page must be free again; if not, the front stops
            # trusting the pool.
            "leaked_pages": alloc.num_pages - alloc.num_free,
            "stats": dict(zip(wire.STATS_KEYS, self.counters()))}))


class _Profile:
    """``CRUCIBLE_CORE_PROFILE=PATH`` (Settings.core_profile, a diagnostic): the engine
    process's loop runs under cProfile and its stats go to PATH (pstats format) every few
    seconds and at the end, since the front may end this process at any time. Read them
    with ``python3 -m pstats PATH``."""

    EVERY_S = 5.0

    def __init__(self, path: str) -> None:
        import cProfile

        self.path, self.next = path, time.monotonic() + self.EVERY_S
        self.prof = cProfile.Profile()
        self.prof.enable()

    def tick(self) -> None:
        if time.monotonic() >= self.next:
            self.next = time.monotonic() + self.EVERY_S
            self.dump()

    def dump(self) -> None:
        self.prof.disable()
        try:
            self.prof.dump_stats(self.path)
        except OSError as exc:  # the loop goes on; the diagnostic says why it has no file
            print(f"crucible: CRUCIBLE_CORE_PROFILE: cannot write {self.path}: {exc}",
                  file=sys.stderr)
        self.prof.enable()
