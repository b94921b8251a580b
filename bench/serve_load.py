"""The clients of bench/serve_clients.py. They are spread over worker processes, and each
process runs its share of the clients on one asyncio loop.

Why processes: at tens of thousands of streamed tokens per second, one Python client
process spends about a core on reading SSE alone. Its own lag would then show up as the
server's gaps. Clients go round robin over ``--client-procs`` processes. Every worker
reports its CPU time, so the JSON says whether the clients were near saturation.

A client streams ``/v1/completions`` requests back to back (``stream_options.include_usage``)
until ``stop_at``. Client i of n starts at ``start + ramp * i / n``. The timed window runs from
``start + ramp + settle`` to ``stop_at``. Staggered starts and a window that opens only after
them keep the start burst (every client's prefill at once, a cost that grows with the client
count) out of the figures; ``settle`` keeps the level's own warm-up out too (its queue
reaching its steady length, the graph captures of its step shapes). A request in flight at
``stop_at`` runs to its end (the drain), so every request sent is counted whole by the
server's counters. Per request it records:

* TTFT: send to the first content chunk, for requests sent inside the window.
* The gaps between content chunks, kept when the later chunk lands inside the window.
* How many chunks fell inside the window.
* The usage chunk's prompt and completion tokens. ``ignore_eos`` makes the completion
  tokens exact, and one short of ``max_tokens`` counts as an error.

A chunk usually carries one token. A byte-level tokenizer can hold back half a character,
so tokens are counted from usage, never from chunks. Several chunks read by one socket
read count as coalesced: that is client lag made visible.
"""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from serve_metrics import CpuMeter, Probe, scrape
from serve_mixes import Served, bodies

ERROR_BACKOFF_S = 0.01  # a refused request is retried soon, not in a hot loop
STALL_S = 60.0  # no byte for this long on a stream is an error, never a hung bench
DRAIN_LIMIT_S = 120.0  # a request still running this long after the window is cut off
START_DELAY_S = 0.3  # time for every worker to get its task before the common start
SETTLE_S = 5.0  # the longest wait for /metrics to count the tokens the clients saw


@dataclass(frozen=True)
class Task:
    """One worker's share of a level (pickled to its process)."""

    url: str
    model: str
    mix: str
    served: Served
    clients: tuple[tuple[int, str], ...]  # (client index, its key)
    total: int  # clients in the level, over all workers
    start: float  # time.monotonic(), shared by every process on the host
    ramp: float  # client i starts at start + ramp * i / total; the window opens after it
    stop_at: float
    settle: float = 0.0  # seconds between the last client's start and the window

    @property
    def window_start(self) -> float:
        return self.start + self.ramp + self.settle


def spread(keys: list[str], procs: int) -> list[tuple[tuple[int, str], ...]]:
    """Client i goes to worker i % procs. No worker is left without clients."""
    n = max(1, min(procs, len(keys)))
    return [tuple((i, k) for i, k in enumerate(keys) if i % n == w) for w in range(n)]


class Sink:
    """What one worker's clients collected."""

    def __init__(self) -> None:
        self.requests: list[tuple] = []  # see ``request_fields``
        self.ttft: list[float] = []
        self.gaps = array("d")
        self.errors: Counter[str] = Counter()
        self.first_error: str | None = None

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if self.first_error is None:
            self.first_error = f"{kind}: {detail[:300]}"


REQUEST_FIELDS = ("client", "seq", "t_send", "t_end", "prompt_tokens", "output_tokens",
                  "max_tokens", "chunks", "chunks_in_window", "coalesced")


async def _one(s: aiohttp.ClientSession, t: Task, client: int, seq: int, body: dict,
               sink: Sink) -> bool:
    """One streamed request; False when it failed (the error is in ``sink``)."""
    t0 = time.monotonic()
    last, chunks, inside, coalesced, usage = 0.0, 0, 0, 0, None
    async with s.post(t.url + "/v1/completions", json=body) as r:
        if r.status != 200:
            sink.error(f"http_{r.status}", await r.text())
            return False
        buf = b""
        async for data in r.content.iter_any():
            now = time.monotonic()
            buf += data
            *events, buf = buf.split(b"\n\n")
            fresh = True  # the first chunk of this read is not coalesced
            for ev in events:
                if not ev.startswith(b"data: {"):
                    continue  # [DONE] and blank keep-alives
                if ev.startswith(b'data: {"error"'):
                    sink.error("stream_error", ev[6:].decode("utf-8", "replace"))
                    return False
                if b'"choices": []' in ev:  # the include_usage chunk, last before [DONE]
                    usage = json.loads(ev[6:])["usage"]
                    continue
                in_window = t.window_start <= now <= t.stop_at
                if chunks == 0:
                    if t0 >= t.window_start:  # sent inside the window
                        sink.ttft.append(now - t0)
                elif in_window:
                    sink.gaps.append(now - last)
                coalesced += not fresh
                fresh = False
                chunks += 1
                inside += in_window
                last = now
    if usage is None:
        sink.error("no_usage", "the stream ended without its usage chunk")
        return False
    out = usage["completion_tokens"]
    sink.requests.append((client, seq, t0, time.monotonic(), usage["prompt_tokens"], out,
                          body["max_tokens"], chunks, inside, coalesced))
    if out != body["max_tokens"]:
        sink.error("short", f"{out} of max_tokens {body['max_tokens']} with ignore_eos")
        return False
    return True


async def _client(s: aiohttp.ClientSession, t: Task, client: int, key: str,
                  sink: Sink) -> None:
    stream = bodies(t.mix, key, t.served)
    await asyncio.sleep(max(0.0, t.start + t.ramp * client / t.total - time.monotonic()))
    seq = 0
    while time.monotonic() < t.stop_at:
        body = {"model": t.model, **next(stream), "stream": True,
                "stream_options": {"include_usage": True}}
        if isinstance(body["prompt"], list):
            # One id prompt is sent as a list of one id list. The server refuses a flat
            # list longer than --max-queue as "too many prompts" before it looks at the
            # items, and a chat prompt can be 2,000 ids.
            body["prompt"] = [body["prompt"]]
        try:
            ok = await asyncio.wait_for(_one(s, t, client, seq, body, sink),
                                        max(1.0, t.stop_at + DRAIN_LIMIT_S - time.monotonic()))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            sink.error(type(exc).__name__, str(exc) or repr(exc))
            ok = False
        if not ok:
            await asyncio.sleep(ERROR_BACKOFF_S)
        seq += 1


async def _run(t: Task) -> dict[str, Any]:
    sink = Sink()
    cpu0 = time.process_time()
    conn = aiohttp.TCPConnector(limit=0)  # one connection per client, kept alive
    timeout = aiohttp.ClientTimeout(total=None, sock_read=STALL_S)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        await asyncio.gather(*(_client(s, t, i, k, sink) for i, k in t.clients))
    return {"requests": sink.requests, "ttft": sink.ttft, "gaps": sink.gaps,
            "errors": dict(sink.errors), "first_error": sink.first_error,
            "cpu_s": time.process_time() - cpu0, "clients": len(t.clients)}


def worker(t: Task) -> dict[str, Any]:
    """A client process's entry point: run its clients of one level."""
    return asyncio.run(_run(t))


def ready(_: int) -> bool:
    """A no-op task, so every pool process is started (imports done) before a level."""
    time.sleep(0.05)
    return True


async def measure(pool: Any, url: str, model: str, mix: str, served: Served, keys: list[str],
                  seconds: float, ramp: float, procs: int, front_pid: int,
                  settle: float = 0.0) -> dict[str, Any]:
    """One level: len(keys) clients starting over ``ramp``, ``settle`` seconds more, then the
    ``seconds`` window, then the drain, with the probe and the /metrics and CPU figures
    around it. Returns the raw material for serve_report.level."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        before = await scrape(s, url)
        start = time.monotonic() + START_DELAY_S
        stop_at = start + ramp + settle + seconds
        futs = [loop.run_in_executor(pool, worker, Task(url, model, mix, served, group,
                                                        len(keys), start, ramp, stop_at,
                                                        settle))
                for group in spread(keys, procs)]
        probe, done = Probe(), asyncio.Event()
        cpu = CpuMeter(front_pid)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        cpu.begin()
        probes = [asyncio.create_task(probe.health(s, url, done)),
                  asyncio.create_task(probe.gauges(s, url, done))]
        parts = await asyncio.gather(*futs)
        cpu_fig = cpu.end()
        done.set()
        await asyncio.gather(*probes)
        # A handler adds its tokens to /metrics just after its client saw [DONE]: wait
        # until the counters hold every token the clients counted (or give up).
        seen = sum(r[5] for p in parts for r in p["requests"])
        settle_by = time.monotonic() + SETTLE_S
        after = await scrape(s, url)
        while (after.get("generated_tokens", 0) - before.get("generated_tokens", 0) < seen
               and time.monotonic() < settle_by):
            await asyncio.sleep(0.05)
            after = await scrape(s, url)
    return {"clients": len(keys), "seconds": seconds, "start": start, "ramp": ramp,
            "settle": settle, "stop_at": stop_at,
            "parts": parts, "probe": probe, "before": before, "after": after,
            "cpu": cpu_fig, "procs": len(parts)}
