"""The chat's in-process backend: the engine in this process, streamed by AsyncLLMEngine.

The engine steps in AsyncLLMEngine's worker thread, never in the thread that reads the
terminal, so a Ctrl-C cannot land in the middle of a step: it cancels the reply's task,
whose stream then aborts the request (the worker frees its pages before the next step).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from contextlib import aclosing

from crucible.chat.reply import ChatError, Reply, ReplyMeter
from crucible.cli_generate import build_engine, sampling_from_args, stats_line
from crucible.engine.async_engine import AsyncLLMEngine
from crucible.engine.engine import LLMEngine
from crucible.errors import QueueFullError, RequestError


class LocalBackend:
    """Replies from an engine built from the chat's model and sampling flags."""

    def __init__(self, engine: LLMEngine, args: argparse.Namespace) -> None:
        self.engine = engine
        self.streams = AsyncLLMEngine(engine)
        self.params = sampling_from_args(args)
        runner = engine.runner
        self.model = runner.model.name
        self.where = f"device {runner.device}, weights {runner.model.weights_mode}"
        self.max_tokens = self.params.max_tokens
        self._ids = itertools.count()
        self._current: str | None = None  # the request of the latest reply

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LocalBackend":
        return cls(build_engine(args), args)

    async def reply(self, messages: list[dict[str, str]], meter: ReplyMeter) -> None:
        ids = self.engine.tokenizer.encode_chat(messages)
        meter.prompt_tokens = len(ids)
        self._current = rid = f"chat-{next(self._ids)}"
        try:
            stream = self.streams.generate(ids, self.params, request_id=rid)
        except (RequestError, QueueFullError) as exc:
            raise ChatError(str(exc)) from None
        # aclosing: a cancelled task leaves the stream at once, and closing it aborts the
        # request instead of leaving that to garbage collection.
        async with aclosing(stream):
            async for delta in stream:
                meter.cached_tokens = delta.num_cached_tokens
                meter.add(delta.new_text, len(delta.new_token_ids))
                if delta.finished:
                    meter.finish(delta.finish_reason or "stop")

    def settle(self, timeout: float = 5.0) -> None:
        """After a cancel or an error: abort the latest request (idempotent, for a stream
        that was never closed) and wait until the worker has applied it, so the request
        is gone and its pages are free when the next prompt shows."""
        if self._current is not None:
            self.streams.abort(self._current)
        deadline = time.monotonic() + timeout
        while (self.engine.has_unfinished() or self.streams.num_pending) and \
                time.monotonic() < deadline:
            time.sleep(0.005)

    def engine_line(self) -> str:
        st = self.engine.stats()
        return (f"engine: {st['pages_free']}/{st['pages_total']} pages free | "
                f"{st['tokens_generated']} tokens generated in {st['steps']} steps")

    def stats_line(self, reply: Reply) -> str:
        return stats_line({"prompt_tokens": reply.prompt_tokens or 0,
                           "generated_tokens": reply.generated_tokens,
                           "ttft_s": reply.ttft_s or 0.0, "decode_tok_s": reply.decode_tok_s,
                           "finish_reason": reply.finish_reason,
                           "cached_tokens": reply.cached_tokens}, self.engine)

    def close(self) -> None:
        asyncio.run(self.streams.shutdown())
