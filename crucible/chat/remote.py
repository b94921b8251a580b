"""The chat's HTTP backend: a running Crucible (or any OpenAI-compatible) server.

Each reply is one ``POST /v1/chat/completions`` with ``stream: true``, so a terminal user's
turns ride in the server's packed batch next to every other client. Cancelling a reply
closes its connection; the server sees the hang-up and aborts the request, freeing its
pages. The model name comes from ``/v1/models``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from crucible.chat.reply import ChatError, Reply, ReplyMeter

_CONNECT_TIMEOUT_S = 10.0
_LOAD_WAIT_S = 300.0  # a big model's first load can take minutes


def base_url(url: str) -> str:
    """``http://host:port``, ``.../`` and ``.../v1`` all name the same server."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ChatError(f"--url must start with http:// or https://, got {url!r}")
    return url[:-3].rstrip("/") if url.endswith("/v1") else url


def _error_text(status: int, body: str) -> str:
    """An OpenAI-shaped error's message, else the start of the body."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.strip()[:200] or "(no body)"
    hint = " (pass --api-key)" if status == 401 else ""
    return f"the server answered {status}: {message}{hint}"


class RemoteBackend:
    """Replies streamed from ``url``; the sampling flags become the request's fields."""

    def __init__(self, url: str, api_key: str | None, args: argparse.Namespace) -> None:
        self.url = base_url(url)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_tokens = args.max_tokens
        self.fields: dict[str, Any] = {"max_tokens": args.max_tokens,
                                       "temperature": args.temperature, "top_p": args.top_p,
                                       "seed": args.seed}
        # Only what differs from the neutral value: other servers may not know these names.
        if args.top_k is not None:
            self.fields["top_k"] = args.top_k
        if args.min_p:
            self.fields["min_p"] = args.min_p
        if args.repetition_penalty != 1.0:
            self.fields["repetition_penalty"] = args.repetition_penalty
        self.where = f"server {self.url}"
        self.model = asyncio.run(self._model_name())

    def _session(self) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=None, connect=_CONNECT_TIMEOUT_S)
        return aiohttp.ClientSession(headers=self.headers, timeout=timeout)

    async def _model_name(self) -> str:
        """The first model /v1/models lists, waiting out a server that is still loading
        (503 with Retry-After) for up to _LOAD_WAIT_S."""
        deadline = time.monotonic() + _LOAD_WAIT_S
        told = False
        try:
            async with self._session() as s:
                while True:
                    async with s.get(self.url + "/v1/models") as r:
                        body = await r.text()
                        retry = r.headers.get("Retry-After", "")
                    if r.status == 200:
                        break
                    if r.status != 503 or not retry.isdigit() or time.monotonic() > deadline:
                        raise ChatError(f"{self.url}/v1/models: {_error_text(r.status, body)}")
                    if not told:
                        print(f"crucible: {self.url} is loading its model; waiting",
                              file=sys.stderr, flush=True)
                        told = True
                    await asyncio.sleep(min(int(retry), 5))
        except aiohttp.ClientError as exc:
            raise ChatError(f"cannot reach {self.url}: {exc}") from None
        try:
            return str(json.loads(body)["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise ChatError(f"{self.url}/v1/models did not list a model") from None

    async def reply(self, messages: list[dict[str, str]], meter: ReplyMeter) -> None:
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **self.fields}
        try:
            async with self._session() as s, \
                    s.post(self.url + "/v1/chat/completions", json=body) as r:
                if r.status != 200:
                    raise ChatError(_error_text(r.status, await r.text()))
                async for raw in r.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, event names
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    self._frame(data, meter)
        except aiohttp.ClientError as exc:
            raise ChatError(f"the connection to {self.url} failed: {exc}") from None

    @staticmethod
    def _frame(data: str, meter: ReplyMeter) -> None:
        try:
            frame = json.loads(data)
        except ValueError:
            raise ChatError(f"the server sent a frame that is not JSON: {data[:80]!r}") from None
        if "error" in frame:
            err = frame["error"]
            raise ChatError(str(err.get("message", err) if isinstance(err, dict) else err))
        usage = frame.get("usage")
        if usage:  # the last frame: the server's own counts beat counting pieces
            meter.prompt_tokens = usage.get("prompt_tokens")
            meter.generated_tokens = usage.get("completion_tokens", meter.generated_tokens)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            meter.cached_tokens = cached or 0
        for choice in frame.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or ""
            # One piece is one token on Crucible (and most servers) until usage says.
            meter.add(text, 1 if text else 0)
            if choice.get("finish_reason"):
                meter.finish(choice["finish_reason"])

    def settle(self) -> None:
        """Nothing to wait for here: the server frees the pages of a closed stream."""

    def engine_line(self) -> None:
        return None  # the server's engine is its own: see its /metrics

    def stats_line(self, reply: Reply) -> str:
        rate = "-" if reply.decode_tok_s is None else f"{reply.decode_tok_s:.1f}"
        prompt = "?" if reply.prompt_tokens is None else reply.prompt_tokens
        cached = f" ({reply.cached_tokens} cached)" if reply.cached_tokens else ""
        ttft = "-" if reply.ttft_s is None else f"{reply.ttft_s * 1000:.0f}"
        return (f"[prompt {prompt} tok{cached} | generated {reply.generated_tokens} tok "
                f"({reply.finish_reason}) | ttft {ttft} ms | decode {rate} tok/s | "
                f"{self.where}]")

    def close(self) -> None:
        pass
