"""Running a server (foreground or in a thread) around an engine built by engine/factory.py.

The engine runs either in its own process (an ``EngineProcessConfig``: the model spec
and Settings the child builds it from, engine_client.py) or in this one (a function that
builds it, run in an executor thread; then engine_loop.py drives it). Either way the HTTP
listener starts before the model loads, so /health can answer 503 ("loading") while
weights are read. ``ServerThread`` runs the same server on its own event loop in a daemon
thread: tests and the load generator use it to get a real server on an ephemeral port.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import asdict
from typing import Any, Callable, Union

from aiohttp import web

from crucible.engine.engine import LLMEngine
from crucible.engine.factory import EngineInfo, freeze_startup
from crucible.errors import CrucibleError
from crucible.server.engine_client import EngineClient, EngineLoadError, EngineProcessConfig
from crucible.server.engine_loop import EngineLoop
from crucible.server.fronts import FrontsClient, push_metrics, start_fronts, stop_fronts
from crucible.server.listen import close_server, listen
from crucible.server.serving_engine import ServingEngine
from crucible.server.state import ServerConfig, ServerState
from crucible.server.stream import EngineGone

log = logging.getLogger("crucible.server")
# In its own process, or built here by this function (an in-process engine).
EngineSource = Union[EngineProcessConfig, Callable[[], tuple[LLMEngine, EngineInfo]]]


async def start_server(state: ServerState, host: str, port: int, source: EngineSource,
                       *, freeze_gc: bool = True, fronts: int = 1, log_level: str = "info"
                       ) -> tuple[web.AppRunner, int, asyncio.Task]:
    """Listen now; load the engine in the background. Returns (runner, port, load task).

    ``freeze_gc``: once an engine process is ready, move everything alive (the tokenizer,
    its tables, the app) out of the collector's sight (factory.freeze_startup), as a
    process serving one engine for its life does; per-token garbage then costs collections
    only for itself. Off for servers inside another program (ServerThread: tests).
    ``fronts`` > 1 (an engine process only): this front shares the port with fronts - 1
    front processes started once the engine is ready (server/fronts.py, ``log_level``
    theirs); the load fails if one of them cannot listen."""
    if fronts > 1 and not isinstance(source, EngineProcessConfig):
        raise ValueError("several fronts need the engine in a process of its own")
    runner, bound = await listen(state, host, port, reuse_port=fronts > 1)

    async def load() -> None:
        try:
            engine, info = await (_start_process(state, source, fronts)
                                  if isinstance(source, EngineProcessConfig)
                                  else _start_here(source))
            if fronts > 1:
                assert isinstance(engine, FrontsClient)
                state.front_procs = await asyncio.to_thread(
                    start_fronts, engine.spare_ends, host, bound, state.config, log_level)
                state.pusher = asyncio.create_task(push_metrics(state, engine))
        except Exception as exc:
            state.load_error = _load_failed(exc)
            if state.starting is not None:
                await state.starting.stop()
            return
        state.attach(engine, info)
        if freeze_gc and isinstance(source, EngineProcessConfig):
            freeze_startup()  # in-process, the builder froze the engine already (cli_serve)
        log.info("ready: %s", ", ".join(f"{k}={v}" for k, v in info.items()))
        if fronts > 1:
            log.info("%d fronts share port %d (pids %s and this one)", fronts, bound,
                     ", ".join(str(p.pid) for p in state.front_procs))

    return runner, bound, asyncio.create_task(load())


async def _start_process(state: ServerState, cfg: EngineProcessConfig, fronts: int = 1
                         ) -> tuple[ServingEngine, dict[str, Any]]:
    client = FrontsClient(cfg, fronts) if fronts > 1 else EngineClient(cfg)
    state.starting = client  # so a shutdown during the load stops the process too
    info = await client.start()
    log.info("engine process %d", client.pid)
    return client, info


async def _start_here(make_engine: Callable[[], tuple[LLMEngine, EngineInfo]]
                      ) -> tuple[ServingEngine, dict[str, Any]]:
    loop = asyncio.get_running_loop()
    engine, built = await loop.run_in_executor(None, make_engine)
    engine_loop = EngineLoop(engine)
    engine_loop.start(loop)
    return engine_loop, asdict(built)


def _load_failed(exc: Exception) -> str:
    """Log a load failure once; return what /health reports. A user-facing problem (a bad
    path or file, the engine process dying) is its message alone, anything else comes
    with its traceback."""
    if isinstance(exc, EngineLoadError):  # raised in the engine process: its own words
        log.error("model load failed: %s%s", exc, "" if exc.expected else "\n" + exc.details)
        return str(exc)
    if isinstance(exc, EngineGone):
        log.error("model load failed: %s", exc)
        return str(exc)
    log.error("model load failed: %s", exc,
              exc_info=None if isinstance(exc, CrucibleError) else exc)
    return f"{type(exc).__name__}: {exc}"


async def stop_server(state: ServerState, runner: web.AppRunner) -> None:
    """Stop the other fronts, then this one (listen.py close_server)."""
    if state.pusher is not None:
        state.pusher.cancel()
    if state.front_procs:
        await asyncio.to_thread(stop_fronts, state.front_procs)
    await close_server(state, runner)


class ServerThread:
    """A real server on 127.0.0.1:<ephemeral> in a background thread (tests, benchmarks)."""

    def __init__(self, source: EngineSource, config: ServerConfig | None = None,
                 host: str = "127.0.0.1", fronts: int = 1) -> None:
        self.state = ServerState(config or ServerConfig())
        self._source = source
        self._fronts = fronts
        self._host = host
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.load_task: asyncio.Task | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="crucible-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def start(self, wait_loaded: bool = True, timeout: float = 120.0) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("server did not start listening")
        if wait_loaded:
            asyncio.run_coroutine_threadsafe(self._wait_loaded(), self._loop).result(timeout)
        return self

    async def _wait_loaded(self) -> None:
        assert self.load_task is not None
        await self.load_task
        if self.state.load_error:
            raise RuntimeError(self.state.load_error)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            self._runner, self.port, self.load_task = await start_server(
                self.state, self._host, 0, self._source, freeze_gc=False,
                fronts=self._fronts, log_level="warning")
            self._ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    def call(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the server's event loop and return its result (test inspection)."""
        async def wrapper() -> object:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(30)

    def engine_stats(self) -> dict[str, Any]:
        """The engine's counters now, wherever it runs (a round trip to its process)."""
        engine = self.state.engine_loop
        if engine is None:
            raise RuntimeError("the engine is not loaded")
        return asyncio.run_coroutine_threadsafe(engine.fresh_stats(), self._loop).result(30)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(stop_server(self.state, self._runner),
                                             self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
