"""The front's end of the engine process: spawning it, the pipe, and the two threads on it.

``CoreLink`` knows nothing of requests. It spawns crucible/engine/core_process.py with
the spawn context (a fresh interpreter: nothing of the front's threads, sockets or event
loop is forked into it), gives it one end of a ``multiprocessing`` pipe and keeps the
other. A writer thread sends queued frames, so a full pipe (the process is inside a step)
never blocks the event loop; a reader thread hands every frame it receives to
``on_frame`` and, at EOF, reports how the process ended to ``on_exit``. Both callbacks run
on the reader thread.

With ``fronts`` > 1 the process gets a pipe per front: this link keeps the first, and
``spare_ends`` holds the others' front ends for the front processes started later
(server/fronts.py), whose links ``attach`` to their end instead of spawning.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

from crucible.engine.core_process import DEFAULT_FACTORY, core_main
from crucible.engine.settings import Settings


@dataclass(frozen=True)
class EngineProcessConfig:
    model: str  # the model spec, as given to build_engine
    settings: Settings
    factory: str = DEFAULT_FACTORY  # "module:function" building (LLMEngine, EngineInfo)
    stop_timeout: float = 10.0  # seconds to exit after the shutdown message, then SIGTERM


class EngineLoadError(Exception):
    """The engine process could not build its engine; ``expected``: a user-facing error
    (bad path, bad file) whose message says it all, else ``details`` has the traceback."""

    def __init__(self, message: str, expected: bool = True, details: str = "") -> None:
        super().__init__(message)
        self.expected = expected
        self.details = details


class CoreLink:
    def __init__(self, on_frame: Callable[[bytes], None], on_exit: Callable[[str], None]
                 ) -> None:
        self._on_frame = on_frame
        self._on_exit = on_exit
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._proc: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None
        self.exited = False
        self.spare_ends: list[Any] = []  # the other fronts' pipe ends (fronts > 1)
        self._writer: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, cfg: EngineProcessConfig, fronts: int = 1) -> None:
        """Spawn the process (blocking: run it off the event loop)."""
        ctx = multiprocessing.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(fronts)]
        theirs = [t for _, t in pipes]
        self._conn = pipes[0][0]
        self.spare_ends = [o for o, _ in pipes[1:]]
        # daemon: an interpreter that exits normally terminates it too; a killed front is
        # noticed by the process itself (pipe EOF, parent pid watch).
        proc = ctx.Process(target=core_main, name="crucible-engine", daemon=True,
                           args=(theirs, cfg.model, cfg.settings, cfg.factory, os.getpid()))
        try:
            proc.start()
        finally:
            for t in theirs:  # only the child holds these ends now: its exit is our EOF
                t.close()
        self._proc = proc
        self._threads()

    def attach(self, conn: Any) -> None:
        """Serve over a pipe end handed over by the front that spawned the process."""
        self._conn = conn
        self._threads()

    def _threads(self) -> None:
        self._reader = threading.Thread(target=self._read, name="crucible-engine-reader",
                                        daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write, name="crucible-engine-writer",
                                        daemon=True)
        self._writer.start()

    def send(self, frame: bytes) -> None:
        """Queue a frame (any thread); dropped once the process is gone."""
        if not self.exited:
            self._outbox.put(frame)

    def finish(self, timeout: float) -> None:
        """Blocking: wait ``timeout`` s for the process to exit, then SIGTERM, then SIGKILL;
        then wait for the reader to report the exit and release the pipe."""
        proc = self._proc
        if proc is None and self._conn is None:
            return
        if proc is not None:
            proc.join(timeout)
            for end in (proc.terminate, proc.kill):
                if proc.exitcode is not None:
                    break
                end()
                proc.join(2.0)
        else:  # attached: the process is not ours. The writer sends what is queued (the
            # shutdown) and stops; the process then closes its end, which ends the reader.
            self._outbox.put(None)
            if self._writer is not None:
                self._writer.join(5.0)
        if self._reader is not None:
            self._reader.join(5.0)
        self._outbox.put(None)
        self._conn.close()

    def _write(self) -> None:
        while (frame := self._outbox.get()) is not None:
            try:
                self._conn.send_bytes(frame)
            except OSError:  # the process is gone; the reader reports it
                return

    def _read(self) -> None:
        while True:
            try:
                frame = self._conn.recv_bytes()
            except (EOFError, OSError):
                break
            self._on_frame(frame)
        code = None
        if self._proc is not None:
            self._proc.join(5.0)  # EOF: it has closed its end, so it is exiting
            code = self._proc.exitcode
        self.exited = True
        self._outbox.put(None)
        self._on_exit("the engine process closed its pipe" if code is None else
                      f"the engine process exited with code {code}"
                      + (f" (signal {-code})" if code < 0 else ""))
