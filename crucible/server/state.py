"""Server state shared by every handler, and the one path every API takes into the engine.

Each adapter (native, OpenAI, Anthropic) parses its own request shape into token ids plus
``SamplingParams`` and then calls ``ServerState.run``: one internal request type, one
admission path, one place where disconnects turn into aborts and where metrics are kept.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from aiohttp import web

from crucible.engine.sampling import SamplingParams
from crucible.errors import QueueFullError, RequestError
from crucible.server.engine_loop import EngineLoop, EngineUnavailable
from crucible.server.errors import ApiError, bad_request
from crucible.server.metrics import Metrics
from crucible.server.stream import RequestStream


@dataclass(frozen=True)
class ServerConfig:
    model_name: str = "crucible"
    api_key: str | None = None
    max_queue: int = 64  # shown on /metrics; the scheduler enforces it


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.created = int(time.time())
        self.engine_loop: EngineLoop | None = None  # None until the model is loaded
        self.tokenizer: Any = None
        self.max_context = 0
        self.load_error: str | None = None
        self.info: dict[str, Any] = {}  # model/device/weights for logs and /health

    def attach(self, engine_loop: EngineLoop, info: dict[str, Any]) -> None:
        self.engine_loop = engine_loop
        self.tokenizer = engine_loop.engine.tokenizer
        self.max_context = engine_loop.engine.max_context
        self.info = info

    @property
    def ready(self) -> bool:
        return self.engine_loop is not None and self.engine_loop.running

    def health(self) -> tuple[bool, str]:
        if self.load_error:
            return False, f"model failed to load: {self.load_error}"
        if self.engine_loop is None:
            return False, "loading"
        if not self.engine_loop.running:
            return False, self.engine_loop.unhealthy_reason or "engine stopped"
        return True, "ok"

    def default_max_tokens(self, num_prompt: int) -> int:
        """When a chat gives no limit: the rest of the context, capped by what the pool holds
        (a request must fit the pool alone), so an omitted max_tokens never becomes a 400."""
        assert self.engine_loop is not None
        pool_tokens = self.engine_loop.engine.allocator.num_pages * 16
        return max(1, min(self.max_context, pool_tokens) - num_prompt)

    def check_context(self, num_prompt: int, max_tokens: int) -> None:
        if num_prompt + max_tokens > self.max_context:
            raise bad_request(
                f"this request has {num_prompt} prompt tokens and asks for {max_tokens} "
                f"max_tokens: {num_prompt + max_tokens} tokens, more than the model's context "
                f"of {self.max_context} tokens", "max_tokens")

    @asynccontextmanager
    async def run(self, prompts: Sequence[tuple[list[int], SamplingParams]],
                  prefix: str) -> AsyncIterator[list[RequestStream]]:
        """Submit every (prompt, params) pair; all are aborted if the caller leaves early.

        Leaving early covers a client disconnect (the handler is cancelled), an error while
        formatting, and a 429 on the k-th of n choices (the first k-1 must not keep running).
        """
        assert self.engine_loop is not None
        loop = self.engine_loop
        streams: list[RequestStream] = []
        try:
            for ids, params in prompts:
                self.check_context(len(ids), params.max_tokens)
                try:
                    streams.append(await loop.submit(ids, params, loop.next_id(prefix)))
                except QueueFullError as exc:
                    raise ApiError(429, str(exc), code="queue_full") from None
                except RequestError as exc:
                    raise bad_request(str(exc)) from None
                except EngineUnavailable as exc:
                    raise ApiError(503, f"the engine is unavailable: {exc}") from None
            yield streams
        finally:
            for s in streams:
                if not s.finished:
                    loop.abort(s.request_id)
                    s.finish_reason = "abort"
                self.metrics.observe(s)


STATE = web.AppKey("crucible_state", ServerState)
REQUEST_ID = web.RequestKey("crucible_request_id", str)  # echoed as Anthropic's request-id
