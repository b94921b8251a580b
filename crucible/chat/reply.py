"""One chat reply: what it measured, and running it so that Ctrl-C cancels only it.

A reply runs as one asyncio task on a loop of its own, with SIGINT bound to cancelling that
task. The backends never see a KeyboardInterrupt in the middle of their work: cancellation
arrives at an ``await``, where the in-process stream aborts its request in the engine (its
pages freed before the next step) and the HTTP stream closes its connection, which makes a
server abort it. Whatever streamed before the cancel stays measured in the ReplyMeter.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from crucible.errors import CrucibleError


class ChatError(CrucibleError):
    """A reply that failed in words the user can act on (a refused request, a server
    answering an error, an unreachable URL)."""


@dataclass(frozen=True)
class Reply:
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    prompt_tokens: int | None  # None: the server did not say
    generated_tokens: int
    cached_tokens: int
    ttft_s: float | None  # None: no token came
    elapsed_s: float
    decode_tok_s: float | None  # None: fewer than two tokens, or all in one piece


class ReplyMeter:
    """Collects a reply as it streams: text pieces, token counts and their times."""

    def __init__(self, on_text: Callable[[str], None]) -> None:
        self._on_text = on_text
        self._t0 = time.perf_counter()
        self._first: float | None = None
        self._last: float | None = None
        self._pieces: list[str] = []
        self.generated_tokens = 0
        self.prompt_tokens: int | None = None
        self.cached_tokens = 0
        self.finish_reason: str | None = None

    def add(self, text: str, tokens: int) -> None:
        if tokens:
            self._last = time.perf_counter()
            self._first = self._first or self._last
            self.generated_tokens += tokens
        if text:
            self._pieces.append(text)
            self._on_text(text)

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def result(self) -> Reply:
        end = time.perf_counter()
        n, first, last = self.generated_tokens, self._first, self._last
        # A rate needs two tokens apart in time, as generate's stats line counts it.
        rate = (n - 1) / (last - first) if n > 1 and first and last and last > first else None
        return Reply(text="".join(self._pieces), finish_reason=self.finish_reason or "stop",
                     prompt_tokens=self.prompt_tokens, generated_tokens=n,
                     cached_tokens=self.cached_tokens,
                     ttft_s=None if first is None else first - self._t0,
                     elapsed_s=end - self._t0, decode_tok_s=rate)


def run_cancellable(make: Callable[[], Awaitable[None]]) -> bool:
    """Run ``make()`` to its end on a fresh event loop; Ctrl-C cancels it. Returns True
    when it was cancelled. Errors it raises propagate, and so does a KeyboardInterrupt
    where the loop cannot take SIGINT (the caller treats that as a cancel too)."""
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(make())
        try:
            loop.add_signal_handler(signal.SIGINT, task.cancel)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # no loop signals here (Windows, not the main thread): KeyboardInterrupt
        try:
            loop.run_until_complete(task)
            return False
        except asyncio.CancelledError:
            return True
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            # Closing a generator left open runs its cleanup (an abort) on this loop.
            loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
