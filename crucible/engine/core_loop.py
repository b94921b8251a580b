"""The engine process's loop (engine/core_process.py runs it): every front's messages in,
one frame per step and front out.

Each front has a link (a ``multiprocessing`` pipe). The loop takes in every waiting
message of every link (adds, aborts, stats queries, metrics, shutdown), runs one step when
there is work, and sends each link the frame of its own requests' deltas (core_wire.py)
with the engine's counters. Requests are named by (link, handle): each front numbers its
own. Link 0 belongs to the front that spawned the process: its shutdown or EOF stops the
loop. Another link's (server/fronts.py) ends that front's requests only, their pages come
back, and the loop goes on.
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Sequence

from crucible.engine import core_wire as wire
from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.errors import QueueFullError, RequestError


def send_frame(conn: Connection, data: bytes) -> bool:
    try:
        conn.send_bytes(data)
        return True
    except OSError:  # the front is gone
        return False


class EngineCore:
    """The loop over one engine: messages in from every front's link, one frame per step
    and link out."""

    def __init__(self, engine: LLMEngine, conns: Connection | Sequence[Connection]) -> None:
        self.engine = engine
        self.conns: list[Connection] = [conns] if isinstance(conns, Connection) else list(conns)
        self.open = [True] * len(self.conns)  # link i's front is still there
        # live request id -> (link, the front's handle), and back. With several links the
        # engine's ids carry the link ("rid@link"): each front names its requests alone.
        self.handles: dict[str, tuple[int, int]] = {}
        self.rids: dict[tuple[int, int], str] = {}
        self.adds_seen = [0] * len(self.conns)
        self.front_metrics: dict[int, Any] = {}  # link -> its front's latest metrics
        self.stopping = False
        # What late planning (engine/pacing.py) drains while a step runs, sent with its frame.
        self._ended: list[tuple[int, int, RequestDelta]] = []
        self._changed = False
        if engine.pacer is not None:
            engine.pacer.arrivals = self._arrivals

    def run(self, prof: Any = None) -> None:
        """The loop; ``prof``: a profiler ticked every iteration (core_process._Profile)."""
        try:
            self._loop(prof)
        finally:
            if prof is not None:
                prof.dump()

    def _loop(self, prof: Any) -> None:
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
                self._send_step(ended, deltas)

    def _send_step(self, ended: list[tuple[int, int, RequestDelta]],
                   deltas: list[RequestDelta]) -> None:
        handles, forget = self.handles, self._forget
        per: list[list[tuple[int, RequestDelta]]] = [[] for _ in self.conns]
        for link, h, d in ended:
            per[link].append((h, d))
        for d in deltas:
            link, h = forget(d.request_id) if d.finished else handles[d.request_id]
            per[link].append((h, d))
        st = self._stats()  # once a step; each link reads its own adds seen
        for link, out in enumerate(per):  # every front gets the counts, deltas or not
            if self.open[link] and not send_frame(self.conns[link],
                                             wire.encode_step(out, self.counters(link, st))):
                self._close(link, [])

    def _arrivals(self) -> None:
        """Late planning's drain, inside a step: adds and aborts as between steps."""
        if not self.stopping:
            self._changed = self._drain(self._ended, block=False) or self._changed

    def counters(self, link: int = 0, st: dict[str, Any] | None = None) -> list[int]:
        """The engine's counters as link ``link`` reads them (its own adds seen); ``st``:
        this step's ``_stats()``, when several links read them."""
        st = dict(self._stats() if st is None else st)
        st["adds_seen"] = self.adds_seen[link]
        return [int(st[k]) for k in wire.STATS_KEYS]

    def _stats_of(self, link: int) -> dict[str, int]:
        return dict(zip(wire.STATS_KEYS, self.counters(link)))

    def _stats(self) -> dict[str, Any]:
        st: dict[str, Any] = self.engine.stats()
        st["waiting_preempted"] = sum(1 for r in self.engine.scheduler.waiting
                                      if r.num_preemptions)
        return st

    # -- messages --------------------------------------------------------------------------
    def _drain(self, ended: list[tuple[int, int, RequestDelta]], block: bool) -> bool:
        """Apply every waiting message of every link; True if an add or an abort was among
        them."""
        changed = False
        waiting = [c for c, o in zip(self.conns, self.open) if o]
        if block and waiting:  # idle: sleep until a message (or an EOF) arrives on a link
            wait(waiting)
        for link, conn in enumerate(self.conns):
            if self.open[link]:
                changed = self._drain_link(link, conn, ended) or changed
            if self.stopping:
                break
        return changed

    def _drain_link(self, link: int, conn: Connection,
                    ended: list[tuple[int, int, RequestDelta]]) -> bool:
        changed = False
        try:
            while conn.poll(0):
                data = conn.recv_bytes()
                kind = data[0]
                if kind == wire.ADD:
                    self._add(link, data)
                    changed = True
                elif kind == wire.ABORT:
                    for h in wire.decode_abort(data):
                        self._abort(link, h, ended)
                    changed = True
                elif kind == wire.STATS:
                    qid = int.from_bytes(data[1:5], "little")
                    if not send_frame(conn, wire.encode_json(
                            wire.STATS_REPLY, {"qid": qid, "stats": self._stats_of(link)})):
                        raise EOFError
                elif kind == wire.FRONT_METRICS:
                    self.front_metrics[link] = wire.decode_json(data)["metrics"]
                    others = [m for i, m in self.front_metrics.items()
                              if i != link and self.open[i]]
                    if not send_frame(conn, wire.encode_json(wire.FRONTS, {"fronts": others})):
                        raise EOFError
                elif kind == wire.SHUTDOWN:
                    self._close(link, ended)
                    return True
        except (EOFError, OSError):  # the front closed its end or died
            self._close(link, ended, gone=True)
            return True
        return changed

    def _close(self, link: int, ended: list[tuple[int, int, RequestDelta]],
               gone: bool = False) -> None:
        """Link ``link``'s front leaves (shutdown message, EOF, a failed send): its live
        requests end as aborted. Link 0's leaving stops the process and takes every request;
        the aborts go out on the next frame to every front still there (link 0 included
        when it asked to shut down)."""
        if gone or link != 0:
            self.open[link] = False
            if link != 0:
                self.conns[link].close()  # that front's reader sees EOF: it may leave
        self.front_metrics.pop(link, None)
        for rid, (lk, h) in list(self.handles.items()):
            if (link == 0 or lk == link) and self.engine.abort(rid):
                self._forget(rid)
                if self.open[lk]:
                    ended.append((lk, h, RequestDelta.aborted(rid)))
        if link == 0:
            self.stopping = True

    def _add(self, link: int, data: bytes) -> None:
        handle, ids, meta = wire.decode_add(data)
        self.adds_seen[link] += 1
        rid = meta["rid"] if len(self.conns) == 1 else f"{meta['rid']}@{link}"
        try:
            # The front checked these ids too; here the check is a second line, on the
            # wire's array (C scans, not a walk of the list).
            self.engine.add_request(self.engine.checked_ids(ids, meta["params"]),
                                    meta["params"], rid, final_only=meta["final_only"],
                                    cache_salt=meta["cache_salt"],
                                    use_prefix_cache=meta["use_prefix_cache"], checked=True)
        except Exception as exc:  # refused here: the bound raced, or a check the front lacks
            kind = ("queue_full" if isinstance(exc, QueueFullError) else
                    "request" if isinstance(exc, RequestError) else "error")
            if kind == "error":
                traceback.print_exc(file=sys.stderr)
            send_frame(self.conns[link], wire.encode_json(wire.REFUSED, {
                "handle": handle, "kind": kind, "message": f"{exc}" if kind != "error"
                else f"{type(exc).__name__}: {exc}"}))
            return
        self.handles[rid] = (link, handle)
        self.rids[(link, handle)] = rid

    def _forget(self, rid: str) -> tuple[int, int]:
        key = self.handles.pop(rid)
        del self.rids[key]
        return key

    def _abort(self, link: int, handle: int,
               ended: list[tuple[int, int, RequestDelta]]) -> None:
        rid = self.rids.get((link, handle))
        if rid is None or not self.engine.abort(rid):
            return  # it finished meanwhile: its last delta is already on its way
        self._forget(rid)
        ended.append((link, handle, RequestDelta.aborted(rid)))

    def _fail_all(self, exc: Exception) -> None:
        per: dict[int, list[int]] = {i: [] for i in range(len(self.conns))}
        for rid, (link, h) in list(self.handles.items()):
            per[link].append(h)
            self.engine.abort(rid)
            self._forget(rid)
        alloc = self.engine.allocator
        for link, handles in per.items():
            if self.open[link]:
                send_frame(self.conns[link], wire.encode_json(wire.FAILED, {
                    "handles": handles, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                    # Nothing runs now, so every page must be free again; if not, the front
                    # stops trusting the pool.
                    "leaked_pages": alloc.num_pages - alloc.num_free,
                    "stats": self._stats_of(link)}))
