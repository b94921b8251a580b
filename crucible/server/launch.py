"""Building the engine for a server, and running a server (foreground or in a thread).

The HTTP listener starts before the model loads, so /health can answer 503 ("loading")
while weights are read; the model then loads in an executor thread and the engine loop
starts. ``ServerThread`` runs the same server on its own event loop in a daemon thread:
tests and the load generator use it to get a real server on an ephemeral loopback port.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from crucible.engine.engine import LLMEngine
from crucible.engine.scheduler import SchedulerConfig
from crucible.errors import CrucibleError
from crucible.server.app import build_app
from crucible.server.engine_loop import EngineLoop
from crucible.server.state import ServerConfig, ServerState

log = logging.getLogger("crucible.server")
TINY_MODEL = "tiny-random"  # hidden test model: crucible.model.tiny, context 2048


@dataclass(frozen=True)
class EngineSpec:
    model: str = "smollm2-135m-instruct"
    device: str = "auto"
    weights: str = "int8"
    num_pages: int = 1024
    scheduler: SchedulerConfig = SchedulerConfig()
    seed: int = 0


def build_engine(spec: EngineSpec, loaded: Any = None) -> tuple[LLMEngine, dict]:
    """``loaded``: an already loaded model (a LoadedModel) to serve instead of ``spec.model``."""
    from crucible.model.runner import ModelRunner

    if loaded is not None:
        model = loaded
    elif spec.model == TINY_MODEL:
        from crucible.model.tiny import tiny_random_model

        model = tiny_random_model(seed=0, weights=spec.weights, max_context=2048)
    else:
        from crucible.model.loader import load_model

        model = load_model(spec.model, spec.weights)
    runner = ModelRunner(model, num_pages=spec.num_pages, device=spec.device)
    engine = LLMEngine(runner, model.tokenizer, spec.scheduler, seed=spec.seed)
    cfg = spec.scheduler
    info = {"model": model.name, "device": runner.device, "backend": runner.backend.name,
            "weights": model.weights_mode, "context": model.config.max_context,
            "pages": spec.num_pages, "token_budget": cfg.token_budget,
            "chunk_cap": cfg.chunk_cap, "max_queue": cfg.max_queue,
            "attention": _attention_name(runner)}
    return engine, info


def _attention_name(runner: Any) -> str:
    variant = getattr(runner.backend, "variant", None)  # the CuPy backend's selection
    if variant is None:
        return "numpy reference order"
    return str(getattr(variant, "name", variant))


async def start_server(state: ServerState, host: str, port: int,
                       make_engine: Callable[[], tuple[LLMEngine, dict]]
                       ) -> tuple[web.AppRunner, int, asyncio.Task]:
    """Listen now; load the engine in the background. Returns (runner, port, load task)."""
    # handler_cancellation: a client that disconnects cancels its handler, whose finally
    # aborts the request (a non-streaming request has no write that could fail instead).
    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    loop = asyncio.get_running_loop()

    async def load() -> None:
        try:
            engine, info = await loop.run_in_executor(None, make_engine)
        except Exception as exc:
            if isinstance(exc, CrucibleError):  # a user-facing problem: the message says it
                log.error("model load failed: %s", exc)
            else:
                log.exception("model load failed")
            state.load_error = f"{type(exc).__name__}: {exc}"
            return
        engine_loop = EngineLoop(engine)
        engine_loop.start(loop)
        state.attach(engine_loop, info)
        log.info("ready: %s", ", ".join(f"{k}={v}" for k, v in info.items()))

    return runner, bound, asyncio.create_task(load())


async def stop_server(state: ServerState, runner: web.AppRunner) -> None:
    await runner.cleanup()
    if state.engine_loop is not None:
        await state.engine_loop.stop()


class ServerThread:
    """A real server on 127.0.0.1:<ephemeral> in a background thread (tests, benchmarks)."""

    def __init__(self, make_engine: Callable[[], tuple[LLMEngine, dict]],
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
