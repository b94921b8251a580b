"""Running a server (foreground or in a thread) around an engine built by engine/factory.py.

The HTTP listener starts before the model loads, so /health can answer 503 ("loading")
while weights are read; the model then loads in an executor thread and the engine loop
starts. ``ServerThread`` runs the same server on its own event loop in a daemon thread:
tests and the load generator use it to get a real server on an ephemeral loopback port.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import asdict
from typing import Callable

from aiohttp import web

from crucible.engine.engine import LLMEngine
from crucible.engine.factory import EngineInfo
from crucible.errors import CrucibleError
from crucible.server.app import build_app
from crucible.server.engine_loop import EngineLoop
from crucible.server.state import ServerConfig, ServerState
from crucible.server.transport import CrucibleRunner

log = logging.getLogger("crucible.server")


async def start_server(state: ServerState, host: str, port: int,
                       make_engine: Callable[[], tuple[LLMEngine, EngineInfo]]
                       ) -> tuple[web.AppRunner, int, asyncio.Task]:
    """Listen now; load the engine in the background. Returns (runner, port, load task)."""
    # handler_cancellation: a client that disconnects cancels its handler, whose finally
    # aborts the request (a non-streaming request has no write that could fail instead).
    # Connections: headers within --read-timeout (the keep-alive timer), at most
    # --max-connections open (transport.py); bodies are timed by fields.read_body.
    cfg = state.config
    runner = CrucibleRunner(build_app(state), handler_cancellation=True, access_log=None,
                            max_connections=cfg.max_connections, read_timeout=cfg.read_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=min(1024, max(128, cfg.max_connections)))
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()

    async def load() -> None:
        try:
            engine, built = await loop.run_in_executor(None, make_engine)
        except Exception as exc:
            if isinstance(exc, CrucibleError):  # a user-facing problem: the message says it
                log.error("model load failed: %s", exc)
            else:
                log.exception("model load failed")
            state.load_error = f"{type(exc).__name__}: {exc}"
            return
        engine_loop = EngineLoop(engine)
        engine_loop.start(loop)
        info = asdict(built)
        state.attach(engine_loop, info)
        log.info("ready: %s", ", ".join(f"{k}={v}" for k, v in info.items()))

    return runner, bound, asyncio.create_task(load())


async def stop_server(state: ServerState, runner: web.AppRunner) -> None:
    await runner.cleanup()
    if state.engine_loop is not None:
        await state.engine_loop.stop()
    state.tokenize_pool.shutdown(wait=False, cancel_futures=True)


class ServerThread:
    """A real server on 127.0.0.1:<ephemeral> in a background thread (tests, benchmarks)."""

    def __init__(self, make_engine: Callable[[], tuple[LLMEngine, EngineInfo]],
                 config: ServerConfig | None = None, host: str = "127.0.0.1") -> None:
        self.state = ServerState(config or ServerConfig())
        self._make_engine = make_engine
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
                self.state, self._host, 0, self._make_engine)
            self._ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    def call(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` on the server's event loop and return its result (test inspection)."""
        async def wrapper() -> object:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(30)

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
