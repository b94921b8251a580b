"""The engine-core process: the LLMEngine (scheduler, page pool, device) in a process of
its own, driven over one pipe by the server's front (crucible/server/engine_client.py).

The front spawns it with the model spec and Settings it was given; the engine is built
here with the same factory, so the same flags give the same engine as in-process serving.
Then it loops (core_loop.py): take in every waiting message (adds, aborts, stats
queries, shutdown), run one step when there is work, send one frame for that step with
every request's delta (core_wire.py). Only token ids cross: the engine does not detokenise
(``LLMEngine.detokenize``), the front does, with the same code. The process exits when
told to, when the pipe reaches EOF, or when its parent is gone (checked from a thread as
well, so a front killed mid-load or mid-step leaves no orphan). Several fronts
(``llm-engine serve --api-servers N``) each get a pipe of their own, the spawning front's
first; the ready message goes to every pipe.
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
from multiprocessing.connection import Connection
from typing import Sequence

from crucible.engine import core_wire as wire
from crucible.engine.core_loop import EngineCore, send_frame
from crucible.engine.factory import freeze_startup
from crucible.engine.settings import Settings
from crucible.errors import CrucibleError

DEFAULT_FACTORY = "crucible.engine.factory:build_engine"


def core_main(conns: Sequence[Connection], model: str, settings: Settings, factory: str,
              parent_pid: int) -> None:
    """The spawned process's entry point (module level, so spawn can import it); one pipe
    per front, the spawning front's first."""
    conn = conns[0]
    # Ctrl-C reaches the whole process group; the front decides when this process stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent_pid)
    try:
        module, _, name = factory.partition(":")
        build = getattr(importlib.import_module(module), name)
        engine, info = build(model, settings)
        engine.detokenize = False
    except BaseException as exc:  # noqa: BLE001 - every load failure is reported, then exit
        send_frame(conn, wire.encode_json(wire.LOAD_FAILED, {
            "error": f"{type(exc).__name__}: {exc}",
            "expected": isinstance(exc, CrucibleError),
            "traceback": traceback.format_exc()}))
        return
    freeze_startup()  # this process serves one engine for its whole life
    core = EngineCore(engine, conns)
    # The counters go with it, so /metrics shows the pool before the first step.
    ready = {"info": asdict(info), "max_context": engine.max_context,
             "vocab_size": engine.vocab_size, "num_pages": engine.allocator.num_pages,
             "max_queue": engine.config.max_queue, "pid": os.getpid(),
             "tokenizer": wire.tokenizer_payload(engine.tokenizer),
             "stats": dict(zip(wire.STATS_KEYS, core.counters()))}
    frame = wire.encode_json(wire.READY, ready)
    if send_frame(conn, frame):
        for other in conns[1:]:  # a front that is gone already is noticed by the loop
            send_frame(other, frame)
        profile = settings.core_profile
        core.run(None if profile is None else _Profile(str(profile)))


def watch_parent(parent_pid: int) -> None:
    """Exit when the front is gone, even while loading or inside a long step (the pipe's
    EOF is only seen between steps)."""
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="crucible-core-watch", daemon=True).start()


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
