"""Streaming HTTP client side of the load generator: one request, its timings, and summaries.

A request is an OpenAI ``/v1/completions`` stream (what vLLM-style benchmark clients send):
prompt as token ids, fixed output length (``ignore_eos``), ``include_usage`` for the true
token count. Timings are client-side wall clock:
- TTFT: send -> first chunk carrying text;
- ITL: gaps between consecutive text chunks; TPOT: (E2E - TTFT) / (output tokens - 1);
- E2E: send -> end of stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Result:
    kind: str  # workload-local label, e.g. "short", "long", "arrival"
    prompt_tokens: int
    t_send: float = 0.0
    t_first: float | None = None
    t_end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    status: int = 0  # HTTP status; 0 = no response
    error: str | None = None  # None, "http_429", "http_400", "disconnect", "exception:..."

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def e2e(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_send

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


async def stream_request(session: aiohttp.ClientSession, url: str, model: str,
                         prompt: list[int], max_tokens: int, kind: str,
                         disconnect_after: int | None = None) -> Result:
    """Send one streaming completion; ``disconnect_after``: hang up after that many chunks."""
    res = Result(kind, len(prompt))
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    res.t_send = time.perf_counter()
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = f"http_{resp.status}"
                await resp.read()
                res.t_end = time.perf_counter()
                return res
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter()
                msg: dict[str, Any] = json.loads(line[6:])
                if "error" in msg:
                    res.error = f"stream_error:{msg['error'].get('code')}"
                if msg.get("usage"):
                    res.output_tokens = msg["usage"]["completion_tokens"]
                if msg.get("choices") and msg["choices"][0].get("text"):
                    res.t_first = res.t_first or now
                    res.chunk_times.append(now)
                    if disconnect_after is not None and len(res.chunk_times) >= disconnect_after:
                        res.error = "disconnect"  # intentional: counted apart from failures
                        resp.close()
                        break
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        res.error = f"exception:{type(exc).__name__}"
    res.t_end = time.perf_counter()
    return res


def percentiles(values: list[float]) -> dict[str, float | None]:
    """median / p95 / p99 / max in milliseconds (nearest-rank on the sorted values)."""
    if not values:
        return {"n": 0, "median": None, "p95": None, "p99": None, "max": None}
    v = sorted(values)

    def rank(q: float) -> float:
        return v[min(len(v) - 1, max(0, int(round(q * len(v) + 0.5)) - 1))] * 1e3

    return {"n": len(v), "median": rank(0.5), "p95": rank(0.95), "p99": rank(0.99),
            "max": v[-1] * 1e3}


def summarize(results: list[Result], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results), "completed": len(ok),
        "rejected_429": errors.get("http_429", 0),
        "intentional_disconnects": errors.get("disconnect", 0),
        "failures": sum(n for k, n in errors.items() if k not in ("http_429", "disconnect")),
        "errors_by_kind": errors,
        "wall_s": wall_s,
        "request_throughput_rps": len(ok) / wall_s if wall_s > 0 else None,
        "output_throughput_tok_s": out_tokens / wall_s if wall_s > 0 else None,
        "output_tokens": out_tokens,
        "ttft_ms": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": percentiles([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": percentiles([g for r in ok for g in r.itl]),
        "e2e_ms": percentiles([r.e2e for r in ok if r.e2e is not None]),
    }
