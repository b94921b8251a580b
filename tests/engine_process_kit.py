"""What the engine-process tests share: factories the engine process imports by module path
(EngineProcessConfig.factory = "engine_process_kit:<name>"; spawn gives the child the test
process's sys.path, which holds tests/), each taking (model spec, Settings) as build_engine
does and building the tiny random model; and waits on processes and conditions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings


def gated(model: str, settings: Settings):
    """Loads only once the file named by ``model`` exists (at most 60 s): a slow load the
    test ends when it likes."""
    deadline = time.monotonic() + 60
    while not Path(model).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return build_engine(TINY_MODEL, settings)


def slow_steps(model: str, settings: Settings):
    """Every forward takes at least 20 ms longer, so requests stay live long enough for a
    test to kill the process under them."""
    engine, info = build_engine(TINY_MODEL, settings)
    forward = engine.runner.forward
    engine.runner.forward = lambda batch: (time.sleep(0.02), forward(batch))[1]
    return engine, info


def faulty(model: str, settings: Settings):
    """While the file ``model`` names exists, every forward raises; with ``leak`` in its
    text, it first takes a page no request owns (a fault that corrupts the pool)."""
    engine, info = build_engine(TINY_MODEL, settings)
    forward, gate = engine.runner.forward, Path(model)

    def run(batch):
        if gate.exists():
            if "leak" in gate.read_text():
                engine.allocator.allocate(1)
            raise RuntimeError("injected device fault")
        return forward(batch)

    engine.runner.forward = run
    return engine, info


def broken(model: str, settings: Settings):
    """A load that fails with an unexpected exception (not a CrucibleError)."""
    raise ZeroDivisionError("the factory divided by zero")


def gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def engine_pid(srv) -> int:
    """The engine process of a ServerThread, loaded or still loading."""
    engine = srv.state.engine_loop or srv.state.starting
    assert engine is not None and engine.pid
    return engine.pid


def wait_idle(srv, timeout: float = 10.0) -> dict:
    """The server's engine stats once no request is left and every page is free (or fail
    with the last stats): what every test that ends requests checks before the next."""
    deadline = time.monotonic() + timeout
    while True:
        st = srv.engine_stats()
        if st["running"] == st["waiting"] == 0 and st["pages_free"] == st["pages_total"]:
            return st
        assert time.monotonic() < deadline, st
        time.sleep(0.02)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)
