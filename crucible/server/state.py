"""Server state shared by every handler, and the one path every API takes into the engine.

Each adapter (native, OpenAI, Anthropic) parses its own request shape into token ids plus
``SamplingParams`` and then calls ``ServerState.run``: one internal request type, one
admission path, one place where disconnects turn into aborts and where metrics are kept.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from aiohttp import web

from crucible.engine.sampling import SamplingParams
from crucible.errors import QueueFullError, RequestError
from crucible.server.serving_engine import EngineUnavailable, ServingEngine
from crucible.server.errors import ApiError, bad_request
from crucible.server.metrics import Metrics
from crucible.server.stream import RequestStream


MAX_BODY_BYTES = 4 << 20  # --max-body-bytes
READ_TIMEOUT_S = 10.0  # --read-timeout
MAX_CONNECTIONS = 1024  # --max-connections
MAX_RESPONSE_ENTRIES = 262_144  # --max-response-entries: n x max_tokens x (1 + top_logprobs)
PROMPT_CHARS_PER_TOKEN = 8  # a text prompt over 8 x the context in characters cannot fit
TOKENIZE_IN_THREAD_CHARS = 4096  # longer texts are tokenised off the event loop


@dataclass(frozen=True)
class ServerConfig:
    model_name: str = "crucible"
    api_key: str | None = None
    max_queue: int = 64  # shown on /metrics; the scheduler enforces it
    max_body_bytes: int = MAX_BODY_BYTES
    read_timeout: float = READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    max_response_entries: int = MAX_RESPONSE_ENTRIES


def hex_id() -> str:
    """24 random hex digits for request and response ids. Not uuid4: its ``os.urandom`` is a
    system call of tens of microseconds on some machines, twice per request; these ids
    need to be unique, not secret."""
    return f"{random.getrandbits(96):024x}"


class RequestTokens:
    """Token counts of one HTTP request, for its access-log line (app.access_mw).

    ``ServerState.run`` fills the one the access middleware put in ``ACCESS``; prompt tokens
    count once per distinct prompt (as ``usage`` does), output tokens over all choices."""

    __slots__ = ("prompt", "output")

    def __init__(self) -> None:
        self.prompt: int | None = None  # None: the request ran nothing (health, tokenize...)
        self.output = 0


ACCESS: contextvars.ContextVar[RequestTokens | None] = contextvars.ContextVar(
    "crucible_access", default=None)


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.created = int(time.time())
        # The engine (in this process or its own: serving_engine.py); None until loaded.
        self.engine_loop: ServingEngine | None = None
        self.starting: ServingEngine | None = None  # the engine while it loads
        self.tokenizer: Any = None
        self.max_context = 0
        self.load_error: str | None = None
        self.info: dict[str, Any] = {}  # model/device/weights for logs and /health
        # Long prompts are tokenised here, never on the event loop (2 threads: 2 at a time).
        self.tokenize_pool = ThreadPoolExecutor(2, thread_name_prefix="crucible-tokenize")
        # Several fronts (server/fronts.py): the other front processes, started by this one,
        # and the task sending this front's metrics to the engine process.
        self.front_procs: list[Any] = []
        self.pusher: asyncio.Task | None = None

    def attach(self, engine: ServingEngine, info: dict[str, Any]) -> None:
        self.engine_loop = engine
        self.starting = None
        self.tokenizer = engine.tokenizer
        self.max_context = engine.max_context
        self.info = info

    @property
    def loading(self) -> bool:
        return self.engine_loop is None and not self.load_error

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
        pool_tokens = self.engine_loop.num_pages * 16
        return max(1, min(self.max_context, pool_tokens) - num_prompt)

    @property
    def max_prompt_chars(self) -> int:
        return PROMPT_CHARS_PER_TOKEN * self.max_context

    def check_chars(self, num_chars: int, field: str) -> None:
        """Refuse, before tokenising, text that cannot fit the context (> 8 chars a token)."""
        if num_chars > self.max_prompt_chars:
            raise bad_request(
                f"'{field}' has {num_chars} characters, more than the {self.max_prompt_chars} "
                f"this server tokenises ({PROMPT_CHARS_PER_TOKEN} x the model's context of "
                f"{self.max_context} tokens): it cannot fit the context", field)

    async def encode(self, text: str, field: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of a prompt text: length-checked first, long ones off the event loop."""
        self.check_chars(len(text), field)
        tok = self.tokenizer
        try:
            if len(text) < TOKENIZE_IN_THREAD_CHARS:
                return tok.encode(text, add_bos=add_bos)
            return await asyncio.get_running_loop().run_in_executor(
                self.tokenize_pool, tok.encode, text, add_bos)
        except (TypeError, UnicodeError):  # read_json refuses lone surrogates; belt and braces
            raise bad_request(f"'{field}' is not valid Unicode text", field) from None

    async def encode_chat(self, messages: list[dict[str, str]], field: str,
                          add_generation_prompt: bool = True, suffix: str = "") -> list[int]:
        """Ids of messages through the chat template (+ ``suffix``, e.g. a prefill)."""
        self.check_chars(sum(len(m["content"]) for m in messages) + len(suffix), field)
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt) + suffix
        return await self.encode(text, field, None)

    def check_size(self, prompts: Sequence[tuple[list[int], SamplingParams]]) -> None:
        """Refuse what can never be served or would build an unbounded response.

        - more engine requests (n x prompts) than the waiting queue holds: a 429 would be
          retried forever, so it is a 400;
        - n x max_tokens x (1 + top_logprobs) (+ echoed prompt logprobs) over the response
          budget (--max-response-entries).
        """
        assert self.engine_loop is not None
        bound = self.engine_loop.max_queue
        k = len(prompts)
        if k > bound:
            raise bad_request(
                f"this request asks for {k} completions (n x prompts), more than the waiting "
                f"queue's bound of {bound} (--max-queue): it could never be admitted", "n")
        budget = self.config.max_response_entries
        max_tokens = max(p.max_tokens for _, p in prompts)
        top = max(p.logprobs or 0 for _, p in prompts)
        entries = k * max_tokens * (1 + top)
        echoed = sum(len(ids) * (1 + p.prompt_logprobs) for ids, p in prompts
                     if p.prompt_logprobs is not None)
        if entries + echoed > budget:
            extra = f" + {echoed} echoed prompt logprobs" if echoed else ""
            raise bad_request(
                f"n x max_tokens x (1 + top_logprobs) = {k} x {max_tokens} x {1 + top} = "
                f"{entries}{extra} entries, more than this server's response budget of "
                f"{budget} (--max-response-entries); lower n, max_tokens or top_logprobs",
                "max_tokens")

    def check_context(self, num_prompt: int, max_tokens: int) -> None:
        if num_prompt + max_tokens > self.max_context:
            raise bad_request(
                f"this request has {num_prompt} prompt tokens and asks for {max_tokens} "
                f"max_tokens: {num_prompt + max_tokens} tokens, more than the model's context "
                f"of {self.max_context} tokens", "max_tokens")

    @asynccontextmanager
    async def run(self, prompts: Sequence[tuple[list[int], SamplingParams]],
                  prefix: str, cache_salt: str | None = None
                  ) -> AsyncIterator[list[RequestStream]]:
        """Submit every (prompt, params) pair; all are aborted if the caller leaves early.

        Leaving early covers a client disconnect (the handler is cancelled), an error while
        formatting, and a 429 on the k-th of n choices (the first k-1 must not keep running).
        """
        assert self.engine_loop is not None
        loop = self.engine_loop
        streams: list[RequestStream] = []
        tokens = ACCESS.get()
        if tokens is not None:
            tokens.prompt = (tokens.prompt or 0) + sum(
                {id(ids): len(ids) for ids, _ in prompts}.values())
        self.check_size(prompts)
        try:
            for ids, params in prompts:
                self.check_context(len(ids), params.max_tokens)
                try:
                    streams.append(await loop.submit(ids, params, loop.next_id(prefix),
                                                     cache_salt))
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
                if tokens is not None:
                    tokens.output += s.num_output_tokens


STATE = web.AppKey("crucible_state", ServerState)
REQUEST_ID = web.RequestKey("crucible_request_id", str)  # echoed as Anthropic's request-id
