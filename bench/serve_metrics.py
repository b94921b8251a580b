"""Server-side figures for bench/serve_clients.py. The engine's counters come from /metrics,
/health is timed while a level runs, and /proc gives the CPU time of the front and engine
processes.

What /metrics has (crucible/server/metrics.py). The step, preemption and prefix-cache
counters ride on every step frame of the engine, so they are live. The prompt and
generation token counters only grow when a request *ends*. Per-level token rates are
therefore taken from the first request sent to the last one ended, over which every token
is counted. The running and waiting gauges are sampled during the timed window. Graph
captures are not in /metrics, so they are not reported for the server.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

# /metrics name -> the key used here (counters: deltas per level; gauges: sampled).
COUNTERS = {"crucible_engine_steps_total": "steps",
            "crucible_prompt_tokens_total": "prompt_tokens",
            "crucible_generation_tokens_total": "generated_tokens",
            "crucible_preemptions_total": "preemptions",
            "crucible_prefix_cache_hit_tokens_total": "cached_prompt_tokens",
            "crucible_engine_failures_total": "engine_failures",
            "crucible_engine_rows_total": "rows",
            "crucible_engine_generated_tokens_total": "sampled_tokens",
            'crucible_graph_replays_total{kind="decode"}': "decode_replays",
            'crucible_graph_replays_total{kind="prefill"}': "prefill_replays",
            'crucible_graph_replays_total{kind="mixed"}': "mixed_replays",
            "crucible_graph_captures_total": "graph_captures",
            "crucible_graph_capture_seconds_total": "capture_s"}
GRAPH_KEYS = tuple(v for k, v in COUNTERS.items() if k.startswith("crucible_graph"))
GAUGES = {"crucible_requests_running": "running", "crucible_requests_waiting": "waiting",
          "crucible_pages_used": "pages_used", "crucible_pages_total": "pages_total",
          "crucible_queue_bound": "queue_bound"}
HEALTH_EVERY_S = 0.1
METRICS_EVERY_S = 0.25


def parse_metrics(text: str) -> dict[str, float]:
    """The samples of Prometheus text we use, by our key (a labelled series by its full
    name: the graph replays per kind; finish reasons and histogram buckets are not used)."""
    names = {**COUNTERS, **GAUGES}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        if name in names:
            out[names[name]] = float(value)
    return out


async def scrape(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with s.get(url + "/metrics") as r:
        return parse_metrics(await r.text())


class Probe:
    """While a level runs: /health every 0.1 s (the slowest answer and any failure) and
    /metrics every 0.25 s (gauges, with their time, for the window means)."""

    def __init__(self) -> None:
        self.health_max = 0.0
        self.health_failures = 0
        self.health_count = 0
        self.samples: list[tuple[float, dict[str, float]]] = []

    async def health(self, s: aiohttp.ClientSession, url: str, done: asyncio.Event) -> None:
        while not done.is_set():
            t0 = time.monotonic()
            try:
                async with s.get(url + "/health") as r:
                    await r.read()
                    ok = r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            self.health_max = max(self.health_max, time.monotonic() - t0)
            self.health_count += 1
            self.health_failures += not ok
            await asyncio.sleep(HEALTH_EVERY_S)

    async def gauges(self, s: aiohttp.ClientSession, url: str, done: asyncio.Event) -> None:
        while not done.is_set():
            try:
                self.samples.append((time.monotonic(), await scrape(s, url)))
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass  # a missed sample is not a failure; /health counts those
            await asyncio.sleep(METRICS_EVERY_S)


def engine_figures(before: dict[str, float], after: dict[str, float], span_s: float,
                   samples: list[tuple[float, dict[str, float]]], window: tuple[float, float]
                   ) -> dict[str, Any]:
    """Per-level engine figures: counter deltas over ``span_s`` (first send to last end),
    gauge means over the timed window, and ``window``: the counters' deltas between the
    first and last samples inside the window. The span holds the ramp and the drain, whose
    steps have fewer rows (at 256 clients on the H200 it gave 9.4 ms and 182 generated
    tokens a step beside ~249 running requests, while the streams saw a token every
    12.6 ms), so the window's figures are the steady state's."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS.values()}
    span = max(span_s, 1e-9)
    inside = [(t, m) for t, m in samples if window[0] <= t <= window[1]]
    live = [m for _, m in inside]

    def mean(key: str) -> float | None:
        vals = [m[key] for m in live if key in m]
        return round(sum(vals) / len(vals), 2) if vals else None

    tokens = d["prompt_tokens"] + d["generated_tokens"]
    return {"steps": int(d["steps"]), "steps_per_s": round(d["steps"] / span, 1),
            "ms_per_step": round(1000 * span / d["steps"], 3) if d["steps"] else None,
            "prompt_tok_per_s": round(d["prompt_tokens"] / span, 1),
            "generated_tok_per_s": round(d["generated_tokens"] / span, 1),
            "tok_per_s": round(tokens / span, 1),
            "rows_per_step": round(tokens / d["steps"], 2) if d["steps"] else None,
            "generated_tokens": int(d["generated_tokens"]),
            "prompt_tokens": int(d["prompt_tokens"]),
            "cached_prompt_tokens": int(d["cached_prompt_tokens"]),
            "preemptions": int(d["preemptions"]), "engine_failures": int(d["engine_failures"]),
            "mean_running": mean("running"),
            "max_running": max((m.get("running", 0) for m in live), default=None),
            "mean_waiting": mean("waiting"),
            "max_pages_used": max((m.get("pages_used", 0) for m in live), default=None),
            "gauge_samples": len(live), "window": window_figures(inside),
            # How the span's steps ran (servers that report it): the rest ran eagerly.
            "graphs": {k: round(d[k], 3) if k == "capture_s" else int(d[k])
                       for k in GRAPH_KEYS} if any(k in after for k in GRAPH_KEYS) else None}


def window_figures(live: list[tuple[float, dict[str, float]]]) -> dict[str, Any] | None:
    """The engine's own counters (rows computed, tokens sampled: counted per step, where
    the request counters move only when a request ends) between the first and the last of
    ``live`` (time, sample), per second and per step; None with fewer than two samples
    that carry them."""
    keys = ("steps", "rows", "sampled_tokens")
    have = [(t, m) for t, m in live if all(k in m for k in keys)]
    if len(have) < 2 or have[-1][1]["steps"] == have[0][1]["steps"]:
        return None
    (t0, a), (t1, b) = have[0], have[-1]
    dt = t1 - t0
    steps, rows, gen = (b[k] - a[k] for k in keys)
    return {"seconds": round(dt, 3), "steps_per_s": round(steps / dt, 1),
            "ms_per_step": round(1000 * dt / steps, 3), "rows_per_s": round(rows / dt, 1),
            "sampled_tok_per_s": round(gen / dt, 1), "rows_per_step": round(rows / steps, 2),
            "sampled_per_step": round(gen / steps, 2)}


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process from /proc (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn_children(pid: int) -> list[int]:
    """The front's children started by multiprocessing's spawn (not the resource tracker
    spawn may also start), from /proc, oldest first: the engine process, then the other
    fronts of ``--api-servers`` (started once the engine is ready)."""
    try:
        kids = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except OSError:
        return []
    out = []
    for kid in kids:
        try:
            if b"spawn_main" in Path(f"/proc/{kid}/cmdline").read_bytes():
                out.append(kid)
        except OSError:
            continue
    return sorted(out, key=_start_time)


def _start_time(pid: int) -> int:
    """Clock ticks after boot when ``pid`` started (0 if it is gone already)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


class CpuMeter:
    """How many cores the front and its engine process kept busy over a level. This shows
    which of them is the limit: a front near 1.0 is saturated, whatever the engine does."""

    def __init__(self, front_pid: int) -> None:
        kids = spawn_children(front_pid)
        self.pids = {"front": front_pid, **({"engine": kids[0]} if kids else {}),
                     **{f"front{i}": k for i, k in enumerate(kids[1:], start=1)}}
        self.start: dict[str, float | None] = {}
        self.t0 = 0.0

    def begin(self) -> None:
        self.t0 = time.monotonic()
        self.start = {k: cpu_seconds(p) for k, p in self.pids.items()}

    def end(self) -> dict[str, float]:
        wall = max(time.monotonic() - self.t0, 1e-9)
        out = {}
        for k, p in self.pids.items():
            now, was = cpu_seconds(p), self.start.get(k)
            if now is not None and was is not None:
                out[f"{k}_cpu_cores"] = round((now - was) / wall, 2)
        if len(self.pids) > 2:  # several fronts: their sum too
            out["fronts_cpu_cores"] = round(sum(v for k, v in out.items()
                                                if k.startswith("front")), 2)
        return out
