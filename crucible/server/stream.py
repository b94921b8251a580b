"""Per-request output stream: the event-loop end of one request's deltas.

The engine thread hands each ``RequestDelta`` over with the time its step finished; the
stream keeps what every API adapter needs afterwards (all token ids, text, logprobs,
finish reason) and the timing the metrics want (TTFT, inter-token gaps, end-to-end), so
adapters only format. Iterating yields deltas until the finished one; an engine failure
ends the iteration with ``EngineFailure`` instead of leaving the client waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

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
        self._queue: asyncio.Queue[RequestDelta | EngineFailure] = asyncio.Queue()
        self.token_ids: list[int] = []
        self.text = ""
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
                gap = (t - self.t_last) / len(delta.new_token_ids)  # type: ignore[operator]
                self.inter_token.extend([gap] * len(delta.new_token_ids))
            self.t_last = t
        self.token_ids.extend(delta.new_token_ids)
        self.num_cached_tokens = delta.num_cached_tokens
        self.text += delta.new_text
        if delta.new_logprobs:
            self.logprobs.extend(delta.new_logprobs)
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.finished:
            self.finished = True
            self.finish_reason = delta.finish_reason
            self.t_end = t
        self._queue.put_nowait(delta)

    def fail(self, err: EngineFailure) -> None:
        if self.finished:
            return
        self.finished = True
        self.error = err
        self.t_end = time.monotonic()
        self._queue.put_nowait(err)

    # -- consumer side ----------------------------------------------------------------------
    async def __aiter__(self) -> AsyncIterator[RequestDelta]:
        while True:
            item = await self._queue.get()
            if isinstance(item, EngineFailure):
                raise item
            yield item
            if item.finished:
                return

    async def wait(self) -> None:
        """Consume to the end (non-streaming responses); raises EngineFailure on failure."""
        async for _ in self:
            pass


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestDelta]]:
    """Deltas of several streams (n choices, several prompts) as they arrive: (index, delta).

    The first failure ends the merged stream with that ``EngineFailure``.
    """
    if len(streams) == 1:  # the common case needs no tasks
        async for d in streams[0]:
            yield 0, d
        return
    q: asyncio.Queue[tuple[int, RequestDelta | None, EngineFailure | None]] = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for d in s:
                q.put_nowait((i, d, None))
        except EngineFailure as exc:
            q.put_nowait((i, None, exc))
        q.put_nowait((i, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, d, err = await q.get()
            if err is not None:
                raise err
            if d is None:
                remaining -= 1
            else:
                yield i, d
    finally:
        for t in tasks:
            t.cancel()
