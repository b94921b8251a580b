"""Letting the event loop read a step's first tokens and finishes before the next step.

AsyncLLMEngine steps in a worker thread while its callers' coroutines run on an event
loop: one interpreter, one GIL. The worker hands a delta over with
``call_soon_threadsafe`` and goes straight on to plan and launch the next step, holding
the GIL through ~1-3 ms of Python (more when a step launches eagerly). The loop thread,
woken by the hand-over, waits for the GIL until the worker blocks on the device or the
interpreter's switch interval (5 ms) forces a switch. Two things wait with it: a
request's first token reaches its caller late (on the H200's chat bench, a cohort's
first tokens reached their coroutines 4-6 ms after the worker pushed them,
bench/chat-timeline-d0980b7-h200.json), and a closed-loop caller's next request, sent
when its reply ends, misses the step being planned and waits one more.

So after a step whose deltas hold a first token or a finish, the worker waits (GIL
released) until each loop concerned has run what was queued on it and the tasks that
woke, at most ``CAP_S``. The device is not idle meanwhile: a pipelined step is already
queued behind the one whose deltas these are. Steps with neither (steady decode) skip
the wait, so a stream of plain deltas costs nothing more.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Iterable

# The longest a step waits for the loops. In bench/handoff_sim.py's chat (64 users, CI
# machine) the waits were 0.14 ms median and 0.65 ms at most with the cache on, 0.27 ms
# median and one capped of 561 with it off; the cap keeps a loop that is busy elsewhere
# (an HTTP front's other work) from holding the worker up for long.
CAP_S = 0.002


def _mark(loop: asyncio.AbstractEventLoop, done: threading.Event) -> None:
    # Runs on the loop after the callbacks queued before it. The tasks those woke were
    # scheduled behind it with call_soon, so set the event one round later, behind them.
    loop.call_soon(done.set)


def hand_over(loops: Iterable[asyncio.AbstractEventLoop], cap_s: float | None = None) -> bool:
    """Block until every loop has run its queued callbacks and the tasks they woke, or
    ``cap_s`` (default ``CAP_S``) passes. True when every loop got there in time. A
    closed loop counts as done (nobody is listening on it)."""
    cap_s = CAP_S if cap_s is None else cap_s
    waits = []
    for loop in loops:
        done = threading.Event()
        try:
            loop.call_soon_threadsafe(_mark, loop, done)
        except RuntimeError:  # the loop is closed
            continue
        waits.append(done)
    deadline = time.perf_counter() + cap_s
    for done in waits:
        if not done.wait(max(0.0, deadline - time.perf_counter())):
            return False
    return True
