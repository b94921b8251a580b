"""Per-request output stream: the event-loop end of one request's deltas.

The engine side hands each ``RequestDelta`` over with the time its step finished; the
stream keeps what every API adapter needs afterwards (all token ids, text, logprobs,
finish reason) and the timing the metrics want (TTFT, inter-token gaps, end-to-end), so
adapters only format. Iterating yields deltas until the finished one; an engine failure
ends the iteration with ``EngineFailure`` instead of leaving the client waiting.

Deltas go into an ``Outbox``: a deque and at most one waiting future, shared by the
engine requests of one HTTP request (``n`` choices, several prompts), so they arrive in
one order and wake one task. A streaming response may also install a ``direct``
consumer (sse.relay): while nothing is queued, a delta is then formatted and written by
the call that delivers it, and the handler's task is not woken once per token (at 30k
tokens/s a task wake per token was a large share of the front's CPU).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import AsyncIterator, Callable, Union

from crucible.engine.engine import Logprobs, RequestDelta
from crucible.engine.sampling import SamplingParams


class EngineFailure(Exception):
    """The engine ended this request with an error: a failed step (HTTP 500), or, rarely, a
    refusal that only the worker could make (``cause`` QueueFullError -> 429, RequestError
    -> 400, e.g. when a preemption filled the queue between admission check and insert)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class EngineGone(Exception):
    """The engine process exited (killed, crashed, failed to load) while this request was
    live: an ``EngineFailure`` with this cause answers 500 naming how it ended."""


class RequestStream:
    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.outbox = Outbox()
        self.index = 0  # its place among the outbox's streams (the choice index)
        self.token_ids: list[int] = []
        self._pieces: list[str] = []  # the text, joined when read (``+=`` per token is O(n^2))
        self.logprobs: list[Logprobs] = []
        self.prompt_logprobs: tuple[Logprobs | None, ...] | None = None
        self.finished = False
        self.finish_reason: str | None = None
        self.num_cached_tokens = 0  # prompt positions found in the prefix cache
        self.error: EngineFailure | None = None
        # Timing (time.monotonic seconds). Token times are step-completion times.
        self.t_submit = time.monotonic()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.t_end: float | None = None
        self.inter_token: list[float] = []

    @property
    def text(self) -> str:
        """The text so far."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    # -- producer side (event loop, scheduled by the engine thread) -----------------------
    def put(self, delta: RequestDelta, t: float) -> None:
        if self.finished:
            return
        if delta.new_token_ids:
            if self.t_first is None:
                self.t_first = t
            else:
                # A step yields at most one token per request; spread is still per token.
                k = len(delta.new_token_ids)
                gap = (t - self.t_last) / k  # type: ignore[operator]
                if k == 1:
                    self.inter_token.append(gap)
                else:
                    self.inter_token.extend([gap] * k)
            self.t_last = t
        self.token_ids.extend(delta.new_token_ids)
        self.num_cached_tokens = delta.num_cached_tokens
        if delta.new_text:
            self._pieces.append(delta.new_text)
        if delta.new_logprobs:
            self.logprobs.extend(delta.new_logprobs)
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.finished:
            self.finished = True
            self.finish_reason = delta.finish_reason
            self.t_end = t
        self.outbox.push(self.index, delta)

    def fail(self, err: EngineFailure) -> None:
        if self.finished:
            return
        self.finished = True
        self.error = err
        self.t_end = time.monotonic()
        self.outbox.push(self.index, err)

    # -- consumer side (one consumer; a stream in a shared outbox is read through it) ------
    async def __aiter__(self) -> AsyncIterator[RequestDelta]:
        while True:
            for _, item in await self.outbox.take():
                if isinstance(item, EngineFailure):
                    raise item
                yield item
                if item.finished:
                    return

    async def wait(self) -> None:
        """Consume to the end (non-streaming responses); raises EngineFailure on failure."""
        async for _ in self:
            pass


Item = Union[RequestDelta, EngineFailure]


class Outbox:
    """What the engine delivered for one HTTP request and nobody has taken yet: (stream
    index, delta or failure) in arrival order. Loop-thread only."""

    __slots__ = ("items", "waiter", "direct")

    def __init__(self) -> None:
        self.items: deque[tuple[int, Item]] = deque()
        self.waiter: asyncio.Future | None = None
        # (index, delta) -> True if it took the delta; never offered failures or a delta
        # while others are queued, so the order a client sees is the arrival order.
        self.direct: Callable[[int, RequestDelta], bool] | None = None

    def push(self, index: int, item: Item) -> None:
        direct = self.direct
        if direct is not None and not self.items and not isinstance(item, EngineFailure) \
                and direct(index, item):
            return
        self.items.append((index, item))
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    async def take(self) -> list[tuple[int, Item]]:
        """Everything queued, once there is something."""
        while not self.items:
            w = self.waiter = asyncio.get_running_loop().create_future()
            try:
                await w
            finally:
                if self.waiter is w:
                    self.waiter = None
        out = list(self.items)
        self.items.clear()
        return out


def shared_outbox(streams: list[RequestStream]) -> Outbox:
    """One outbox for several streams (stream i's items tagged i); what one of them had
    queued already moves over, stream by stream."""
    first = streams[0].outbox
    if all(s.outbox is first for s in streams):  # one stream, or shared already
        return first
    box = Outbox()
    for i, s in enumerate(streams):
        box.items.extend((i, item) for _, item in s.outbox.items)
        s.outbox.items.clear()
        s.outbox, s.index = box, i
    return box


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestDelta]]:
    """Deltas of several streams (n choices, several prompts) as they arrive: (index, delta).

    The first failure ends the merged stream with that ``EngineFailure``.
    """
    box, left = shared_outbox(streams), len(streams)
    while left:
        for i, item in await box.take():
            if isinstance(item, EngineFailure):
                raise item
            yield i, item
            if item.finished:
                left -= 1
