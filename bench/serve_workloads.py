"""Workloads of the load generator and the loop that plays one against a server.

A workload is a list of ``Arrival``s (when, what kind, prompt length, output length,
optional intentional hang-up). ``play`` sends each at its time, polls /metrics meanwhile
(waiting queue, pages in use, running), and returns per-request results plus the server's
counters before/after, so a workload reports its own 429s, preemptions and page return.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from serve_client import Result, stream_request, summarize
from crucible.server.probe import parse_metrics


@dataclass(frozen=True)
class Arrival:
    at_s: float
    kind: str
    prompt_len: int
    max_tokens: int
    disconnect_after: int | None = None


def _prompt(rng: random.Random, n: int) -> list[int]:
    # Byte-range ids exist in every vocabulary we serve (tiny: 272, SmolLM2: 49152).
    return [rng.randrange(32, 250) for _ in range(n)]


def burst(n: int, prompt_len: int, out: int, kind: str = "req") -> list[Arrival]:
    return [Arrival(0.0, kind, prompt_len, out) for _ in range(n)]


def poisson(rate: float, duration: float, prompt_len: int, out: int, seed: int,
            disconnect_frac: float = 0.0, kind: str = "req") -> list[Arrival]:
    rng = random.Random(seed)
    t, out_list = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out_list
        hang = 4 if rng.random() < disconnect_frac else None
        out_list.append(Arrival(t, kind, prompt_len, out, hang))


def mixed(n: int, rate: float, out: int, seed: int) -> list[Arrival]:
    lengths = (32, 512, 128, 941, 64, 256)
    rng = random.Random(seed)
    t, arr = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        arr.append(Arrival(t, f"p{lengths[i % 6]}", lengths[i % 6], out))
    return arr


def long_arrival(n_decoding: int, decode_out: int, arrival_len: int, delay_s: float
                 ) -> list[Arrival]:
    """``n_decoding`` short streams, then one long prompt lands while they decode."""
    return burst(n_decoding, 32, decode_out, "decoding") + [
        Arrival(delay_s, "arrival", arrival_len, 16)]


async def _poll(session: aiohttp.ClientSession, url: str, samples: list[dict],
                stop: asyncio.Event) -> None:
    t0 = time.perf_counter()
    while not stop.is_set():
        try:
            async with session.get(url + "/metrics") as r:
                m = parse_metrics(await r.text())
            samples.append({"t": time.perf_counter() - t0,
                            "waiting": m["crucible_requests_waiting"],
                            "preempted_waiting": m["crucible_requests_waiting_preempted"],
                            "running": m["crucible_requests_running"],
                            "pages_used": m["crucible_pages_used"]})
        except aiohttp.ClientError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


async def metrics_now(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        return parse_metrics(await r.text())


async def play(url: str, model: str, arrivals: list[Arrival], seed: int = 0
               ) -> tuple[list[Result], dict[str, Any]]:
    rng = random.Random(seed)
    prompts = [_prompt(rng, a.prompt_len) for a in arrivals]
    conn = aiohttp.TCPConnector(limit=0)  # no client-side queueing: the server must cope
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        before = await metrics_now(session, url)
        samples: list[dict] = []
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll(session, url, samples, stop))
        t0 = time.perf_counter()

        async def one(a: Arrival, prompt: list[int]) -> Result:
            await asyncio.sleep(max(0.0, t0 + a.at_s - time.perf_counter()))
            return await stream_request(session, url, model, prompt, a.max_tokens, a.kind,
                                        a.disconnect_after)

        results = await asyncio.gather(*(one(a, p) for a, p in zip(arrivals, prompts)))
        wall = time.perf_counter() - t0
        # Drain: every page must come back once nothing runs (disconnects included).
        deadline = time.perf_counter() + 30
        after = await metrics_now(session, url)
        while (after["crucible_pages_used"] or after["crucible_requests_running"]) and \
                time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
            after = await metrics_now(session, url)
        stop.set()
        await poller
    for r in results:
        r.t_send -= t0
        r.t_first = None if r.t_first is None else r.t_first - t0
        r.t_end = None if r.t_end is None else r.t_end - t0
        r.chunk_times = [c - t0 for c in r.chunk_times]
    server = {
        "queue_peak_polled": max((s["waiting"] - s["preempted_waiting"] for s in samples),
                                 default=0),
        "waiting_peak_polled": max((s["waiting"] for s in samples), default=0),
        "pages_used_peak_polled": max((s["pages_used"] for s in samples), default=0),
        "queue_peak_server": after["crucible_queue_peak"],
        "waiting_peak_server": after["crucible_requests_waiting_peak"],
        "queue_bound": after["crucible_queue_bound"],
        "pages_total": after["crucible_pages_total"],
        "pages_used_after": after["crucible_pages_used"],
        "all_pages_returned": after["crucible_pages_used"] == 0,
        "rejected_429_server": after['crucible_requests_rejected_total{cause="queue_full"}']
        - before['crucible_requests_rejected_total{cause="queue_full"}'],
        "preemptions": after["crucible_preemptions_total"] - before["crucible_preemptions_total"],
        "engine_failures": after["crucible_engine_failures_total"]
        - before["crucible_engine_failures_total"],
        "samples": samples,
    }
    return results, {"wall_s": wall, **server}


def report(results: list[Result], server: dict[str, Any]) -> dict[str, Any]:
    out = summarize(results, server["wall_s"])
    out["server"] = {k: v for k, v in server.items() if k not in ("samples", "wall_s")}
    kinds = sorted({r.kind for r in results})
    if len(kinds) > 1:
        out["by_kind"] = {k: summarize([r for r in results if r.kind == k], server["wall_s"])
                          for k in kinds}
    arrival = [r for r in results if r.kind == "arrival"]
    if arrival and arrival[0].t_first is not None:
        a = arrival[0]
        # The decoding streams' worst gap while the long prompt was being prefilled.
        gaps = [b - g for r in results if r.kind == "decoding"
                for g, b in zip(r.chunk_times, r.chunk_times[1:])
                if b >= a.t_send and g <= a.t_first]
        out["long_arrival"] = {"arrival_ttft_ms": a.ttft * 1e3 if a.ttft else None,
                               "worst_decode_gap_ms": max(gaps) * 1e3 if gaps else None}
    return out
