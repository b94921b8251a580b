"""Late planning of pipelined steps: step t+1 is planned near the end of step t, not at its
start, so requests that arrive while t runs are admitted into t+1.

Why: the pipeline (engine/pipeline_next.py) queues step t+1 as soon as step t is launched,
so a request arriving while t runs can only join t+2: every time to first token carries
one more step than the plain engine's (docs/prefix-cache.md). Planning t+1 just before t
ends takes the arrivals of nearly all of t in, and the device still finds t+1 queued when
t ends, as long as planning and launching fit in the margin left.

How: ``wait`` holds the host until step t's expected end less ``margin_s`` (t started when
the step before it ended, as seen by the host; its expected length is the mean of recent
step lengths), calling ``arrivals`` (the serving loop's own drain of new requests and
aborts) every ``poll_s``, and returns at once when t is done (a step shorter than expected:
the device then idles for the planning time only). It waits only where an arrival could
join at once: nobody waiting, room under ``max_running``. The clock and the sleep are
arguments, so tests drive it in simulated time.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Pacer:
    arrivals: Callable[[], None]  # takes new requests (and aborts) into the engine
    margin_s: float = 0.0015  # before t's expected end: planning and launching t+1
    poll_s: float = 0.0002
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    weight: float = 0.25  # of the newest step in the mean length
    mean_s: float | None = None  # recent steps' mean length
    last_end: float | None = None  # when the host saw the previous step's results
    num_waits: int = 0
    waited_s: float = 0.0
    _launches: deque[float] = field(default_factory=deque)

    def wait(self, pending: Any, may_admit: bool) -> None:
        """Hold until the in-flight step (``pending``: its ``done()``) is due to end less
        the margin, taking arrivals meanwhile; at once when it cannot help."""
        if not may_admit or self.mean_s is None or self.last_end is None:
            return
        until = self.last_end + self.mean_s - self.margin_s
        start = self.clock()
        if start >= until:
            return
        self.num_waits += 1
        while not pending.done():
            self.arrivals()
            now = self.clock()
            if now >= until:
                break
            self.sleep(min(self.poll_s, until - now))
        self.arrivals()
        self.waited_s += self.clock() - start

    def launched(self) -> None:
        """A step was queued (every launched step ends once: ``ended``)."""
        self._launches.append(self.clock())
        while len(self._launches) > 2:  # at most two in flight; a lost one must not linger
            self._launches.popleft()

    def ended(self) -> None:
        """The host has the oldest in-flight step's results: its length is the time since
        it could start (its launch, or the end of the step before it, whichever is later),
        so a late launch's idle gap never counts as step time."""
        now = self.clock()
        launch = self._launches.popleft() if self._launches else now
        start = launch if self.last_end is None else max(self.last_end, launch)
        length = now - start
        self.mean_s = length if self.mean_s is None else (
            (1 - self.weight) * self.mean_s + self.weight * length)
        self.last_end = now
