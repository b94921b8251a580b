"""Engine factories the engine process imports by module path in the process-mode tests
(EngineProcessConfig.factory = "core_factories:<name>"; spawn gives the child the test
process's sys.path, which holds tests/). Each takes (model spec, Settings) as build_engine
does and builds the tiny random model."""

from __future__ import annotations

import time
from pathlib import Path

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


def broken(model: str, settings: Settings):
    """A load that fails with an unexpected exception (not a CrucibleError)."""
    raise ZeroDivisionError("the factory divided by zero")
