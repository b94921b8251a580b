"""The prefix cache bench's multi-turn chat workload (bench/prefix_cache_bench.py,
bench/chat_timeline.py).

``--users`` concurrent users (asyncio on ``llm.async_engine()``), each a
closed loop of ``--turns`` turns: turn t's prompt is the system prompt (``--system-tokens``
random ids, shared by all users) + every earlier turn's user message and the reply that
came back + this turn's user message (``--user-min``..``--user-max`` random ids); the
next turn is sent when this reply has finished. Replies are ``--reply-tokens`` greedy
tokens (temperature 0, ``ignore_eos``). Per request: TTFT (``generate()`` call to the
first delta with new token ids) and latency. Per run: TTFT p50/p99 (also by turn), total
tok/s ((prompt + generated tokens) / wall), output tok/s, prompt tokens the cache served
(``cache_hit_tokens`` / prompt tokens, and the deltas' ``num_cached_tokens``). Exactness:
every run's replies (all users, all turns) must equal the first run's, token for token;
cache on and off must hold the same conversations. Warm-up: ``--warmup-turns`` turns of
the same shape with another system prompt and messages, by default as many as the timed
conversations have: a turn's steps take graph keys of its history's length, so a shorter
warm-up left the later turns' keys to be captured inside the timed part (3-8 captures of
40-90 ms, each on the critical path of a turn's arrivals; docs/prefix-cache.md). What is
captured in the timed part is still counted (``graphs``). A mixed graph is captured the
second time its key is seen, so keys the warm-up met once are captured in the timed turns
(1-3 a cached run on an H100, 2026-12-07); ``--warmup-passes`` runs that many warm-up sets.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from throughput_measure import dist, graph_counters, pct

from crucible import LLM, SamplingParams


def add_chat_args(ap: argparse.ArgumentParser) -> None:
    """The chat workload's shape, the same flags and defaults in every bench that runs it."""
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=500)
    ap.add_argument("--user-min", type=int, default=30, help="user message ids per turn, min")
    ap.add_argument("--user-max", type=int, default=80, help="user message ids per turn, max")
    ap.add_argument("--reply-tokens", type=int, default=64)


def conversations(args: argparse.Namespace, ids: list[int], seed: int, turns: int
                  ) -> tuple[list[int], list[list[list[int]]]]:
    """The shared system prompt and each user's messages (users x turns)."""
    rng = random.Random(seed)
    system = [rng.choice(ids) for _ in range(args.system_tokens)]
    msgs = [[[rng.choice(ids) for _ in range(rng.randint(args.user_min, args.user_max))]
             for _ in range(turns)] for _ in range(args.users)]
    return system, msgs


def first_uses(llm: LLM) -> int:
    """Graph captures so far, and steps run eagerly for want of a graph: a GPU backend's
    first uses (0 on the CPU). Plain counters, read from the event loop while the engine's
    thread steps (a stale read only moves a count to the next request)."""
    return sum(v for k, v in graph_counters(llm).items() if k.endswith(("_captures", "_eager")))


async def chat_run(llm: LLM, system: list[int], msgs: list[list[list[int]]],
                   params: SamplingParams) -> tuple[float, list[dict[str, Any]]]:
    """Every user's closed loop at once; (wall seconds, one record per request)."""
    eng = llm.async_engine()
    records: list[dict[str, Any]] = []

    async def user(u: int) -> None:
        history = list(system)
        for t, msg in enumerate(msgs[u]):
            prompt = history + msg
            reply: list[int] = []
            first = None
            cached = 0
            reason = None
            uses = first_uses(llm)
            t0 = time.perf_counter()
            async for d in eng.generate(prompt, params):
                if first is None and d.new_token_ids:
                    first = time.perf_counter() - t0
                    uses = first_uses(llm) - uses  # while it waited for its first token
                reply.extend(d.new_token_ids)
                cached = max(cached, d.num_cached_tokens)
                reason = d.finish_reason
            records.append({"user": u, "turn": t, "prompt_tokens": len(prompt),
                            "ttft_s": first, "latency_s": time.perf_counter() - t0,
                            "cached_tokens": cached, "finish_reason": reason,
                            "reply": reply, "first_uses": uses if first is not None else 0})
            history = prompt + reply

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(user(u) for u in range(len(msgs))))
        wall = time.perf_counter() - t0
    finally:
        await eng.shutdown()
    records.sort(key=lambda r: (r["user"], r["turn"]))
    return wall, records


def chat_figures(wall: float, recs: list[dict[str, Any]], c0: dict[str, int],
                 c1: dict[str, int]) -> dict[str, Any]:
    n_prompt = sum(r["prompt_tokens"] for r in recs)
    n_out = sum(len(r["reply"]) for r in recs)
    ttft = [r["ttft_s"] * 1e3 for r in recs if r["ttft_s"] is not None]
    clean = [r["ttft_s"] * 1e3 for r in recs if r["ttft_s"] is not None and not r["first_uses"]]
    turns = sorted({r["turn"] for r in recs})
    hit = c1["cache_hit_tokens"] - c0["cache_hit_tokens"]
    return {
        "wall_s": round(wall, 4), "requests": len(recs), "prompt_tokens": n_prompt,
        "output_tokens": n_out, "total_tok_per_s": round((n_prompt + n_out) / wall, 1),
        "output_tok_per_s": round(n_out / wall, 1),
        "ttft_p50_ms": round(pct(ttft, 0.5), 3), "ttft_p99_ms": round(pct(ttft, 0.99), 3),
        "ttft_mean_ms": round(statistics.fmean(ttft), 3),
        # Requests that waited out a graph's first use, and the p50 of those that did not.
        "ttft_with_first_use": len(ttft) - len(clean),
        "ttft_p50_ms_no_first_use": round(pct(clean, 0.5), 3) if clean else None,
        "ttft_p50_ms_by_turn": [round(pct([r["ttft_s"] * 1e3 for r in recs
                                           if r["turn"] == t and r["ttft_s"] is not None],
                                          0.5), 3) for t in turns],
        "latency_ms": dist([r["latency_s"] * 1e3 for r in recs]),
        "no_first_token": sum(r["ttft_s"] is None for r in recs),
        "not_length_finish": sum(r["finish_reason"] != "length" for r in recs),
        "cache_hit_tokens": hit, "cache_hit_share": round(hit / n_prompt, 4),
        "delta_cached_tokens": sum(r["cached_tokens"] for r in recs),
        "cache": {k: c1[k] - c0[k] for k in c1 if k != "cache_pages"}
        | {"cache_pages_at_end": c1["cache_pages"]},
    }
