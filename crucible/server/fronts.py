"""Several HTTP fronts over one engine process (``llm-engine serve --api-servers N``).

One front process is one interpreter: at a few tens of microseconds of CPU per streamed
token (detokenising, the JSON, the SSE write, the socket) it serves ~30,000 tokens/s,
which a busy GPU outruns (docs/serving.md). So, as vLLM's ``--api-server-count`` does, N
front processes share the listening port (SO_REUSEPORT: the kernel spreads new
connections over them) and one engine process: the first front spawns the engine with a
pipe per front (engine/core_process.py), and once it is ready starts the others here,
each with its pipe end and the same ServerConfig. Each front tokenises, detokenises and
writes its own connections' requests; the engine steps them all in one batch.

Every front sends its own metrics to the engine process each ``PUSH_S`` seconds and gets
the others' latest back, so /metrics on any front counts every front's requests (the
others' share up to ``PUSH_S`` old). A front process exits when its parent is gone, on
SIGTERM (the first front's shutdown), and never outlives the engine's pipe for long:
/health then says 503 like the first front's.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from dataclasses import dataclass
from typing import Any

from crucible.engine import core_wire as wire
from crucible.engine.core_process import watch_parent
from crucible.engine.factory import freeze_startup
from crucible.server.engine_client import EngineClient, EngineProcessConfig
from crucible.server.listen import close_server, listen
from crucible.server.state import ServerConfig, ServerState

log = logging.getLogger("crucible.server")

PUSH_S = 1.0  # seconds between a front's metrics pushes
START_TIMEOUT_S = 120.0  # for a front process to be listening


class FrontsClient(EngineClient):
    """An engine client among several fronts: the first front's spawns the process with a
    pipe per front (``spare_ends``: the others' ends), each other front's ``attach``es to
    its own end; every one sends its metrics (``push_metrics``) and keeps the others'
    latest (``other_fronts``)."""

    def __init__(self, config: EngineProcessConfig | None, fronts: int = 1) -> None:
        super().__init__(config, fronts)
        self._handlers[wire.FRONTS] = self._on_fronts

    @property
    def spare_ends(self) -> list[Any]:
        return self._link.spare_ends

    async def attach(self, conn: Any) -> dict[str, Any]:
        """Serve over ``conn``, a pipe of a process another front spawned; returns its
        EngineInfo once its ready message (sent to every pipe at load) is read."""
        loop = self._loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._link.attach(conn)
        return await self._ready

    def push_metrics(self, snapshot: dict[str, Any]) -> None:
        """Send this front's metrics (server/metrics.py snapshot); the answer brings the
        others' (reader thread -> ``other_fronts`` on the loop)."""
        if self.running:
            self._link.send(wire.encode_json(wire.FRONT_METRICS, {"metrics": snapshot}))

    def _on_fronts(self, data: bytes) -> None:
        self._call(setattr, self, "other_fronts", wire.decode_json(data)["fronts"])


@dataclass(frozen=True)
class FrontSpec:
    """What a front process needs besides its pipe end."""

    host: str
    port: int
    config: ServerConfig
    log_level: str
    index: int  # 1.. (the first front, which spawned the engine, is 0)


async def push_metrics(state: ServerState, client: FrontsClient) -> None:
    """Forever: send this front's metrics to the engine process (the answer brings the
    others'). Cancelled when the server stops."""
    while True:
        await asyncio.sleep(PUSH_S)
        client.push_metrics(state.metrics.snapshot(client.stats))


def start_fronts(ends: list[Any], host: str, port: int, config: ServerConfig,
                 log_level: str) -> list[Any]:
    """Blocking (run it off the event loop): start a front process per pipe end, each
    listening on ``port``; return the processes once each listens, or raise RuntimeError
    naming the one that did not (the ones started are stopped again)."""
    ctx = multiprocessing.get_context("spawn")
    procs, readies = [], []
    for i, end in enumerate(ends, start=1):
        ready = ctx.Event()
        spec = FrontSpec(host, port, config, log_level, i)
        proc = ctx.Process(target=front_main, name=f"crucible-front-{i}", daemon=True,
                           args=(end, spec, ready, os.getpid()))
        proc.start()
        end.close()  # the front process holds it now
        procs.append(proc)
        readies.append(ready)
    for i, (proc, ready) in enumerate(zip(procs, readies), start=1):
        if not ready.wait(START_TIMEOUT_S):
            stop_fronts(procs)
            raise RuntimeError(f"front process {i} did not start listening"
                               + (f" (exit code {proc.exitcode})"
                                  if proc.exitcode is not None else ""))
    return procs


def stop_fronts(procs: list[Any], timeout: float = 10.0) -> None:
    """Blocking: SIGTERM each front process (it ends its requests and leaves the engine),
    then SIGKILL what is left after ``timeout``."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    for p in procs:
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join(2.0)


def front_main(conn: Any, spec: FrontSpec, ready: Any, parent_pid: int) -> None:
    """A front process's entry point (module level, so spawn can import it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first front decides when to stop
    watch_parent(parent_pid)
    logging.basicConfig(level=spec.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s[{spec.index}]: %(message)s")
    asyncio.run(_serve(conn, spec, ready))


async def _serve(conn: Any, spec: FrontSpec, ready: Any) -> None:
    state = ServerState(spec.config)
    client = FrontsClient(None)
    state.starting = client
    info = await client.attach(conn)
    state.attach(client, info)
    runner, _ = await listen(state, spec.host, spec.port, reuse_port=True)
    freeze_startup()  # this process serves one engine for its whole life
    pusher = asyncio.create_task(push_metrics(state, client))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ready.set()
    log.info("front %d listening on http://%s:%d", spec.index, spec.host, spec.port)
    await stop.wait()
    pusher.cancel()
    await close_server(state, runner)
