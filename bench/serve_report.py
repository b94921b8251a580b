"""Figures, medians, targets and the printed table for bench/serve_clients.py.

A level's headline ``tok_per_s`` counts the output tokens delivered inside the timed window
(after the ramp, serve_load.py), divided by the window. Each request's usage tokens are
weighted by the share of its chunks that landed in the window. ``span_tok_per_s`` counts
every token of every request sent, from the first send to the last end (the drain
included). That span is the one the engine figures use, so ``span_tok_per_s`` and
``engine.generated_tok_per_s`` must agree. If they do not, the clients lost tokens.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from throughput_measure import pct

from serve_metrics import engine_figures

# Issue #16 item 3. The throughput tolerance lets a plateau's noise pass ("never falls").
TOK_AT_256 = 30_000.0
GAP_P50_AT_256_MS = 10.0
HTTP_OVER_ENGINE = 0.90
FLAT_TOLERANCE = 0.02


def _ms(xs: Any, q: float) -> float | None:
    return round(1000 * pct(list(xs), q), 3) if len(xs) else None


def level(raw: dict[str, Any]) -> dict[str, Any]:
    """One measured level's figures from serve_load.measure's raw material."""
    parts, start, seconds = raw["parts"], raw["start"], raw["seconds"]
    reqs = [r for p in parts for r in p["requests"]]  # serve_load.REQUEST_FIELDS
    gaps = [g for p in parts for g in p["gaps"]]
    ttft = [x for p in parts for x in p["ttft"]]
    errors: Counter[str] = Counter()
    for p in parts:
        errors.update(p["errors"])
    tokens = sum(r[5] for r in reqs)
    window_tokens = sum(r[5] * r[8] / r[7] for r in reqs if r[7])
    span = max((r[3] for r in reqs), default=raw["stop_at"]) - start
    chunks = sum(r[7] for r in reqs)
    probe = raw["probe"]
    cpu_s = [p["cpu_s"] for p in parts]
    out = {"clients": raw["clients"], "requests": len(reqs),
           "requests_per_client": round(len(reqs) / raw["clients"], 2),
           "tokens": tokens, "tok_per_s": round(window_tokens / seconds, 1),
           "span_s": round(span, 3), "span_tok_per_s": round(tokens / span, 1) if span else None,
           "ttft_p50_ms": _ms(ttft, 0.5), "ttft_p99_ms": _ms(ttft, 0.99),
           "gap_p50_ms": _ms(gaps, 0.5), "gap_p99_ms": _ms(gaps, 0.99),
           "errors": sum(errors.values()), "error_kinds": dict(errors),
           "first_error": next((p["first_error"] for p in parts if p["first_error"]), None),
           "health_max_ms": round(1000 * probe.health_max, 1),
           "health_failures": probe.health_failures, "health_probes": probe.health_count,
           "prompt_tokens": sum(r[4] for r in reqs), "chunks": chunks,
           "tokens_per_chunk": round(tokens / chunks, 3) if chunks else None,
           "coalesced_chunks": sum(r[9] for r in reqs),
           "engine": {**engine_figures(raw["before"], raw["after"], span, probe.samples,
                                       (start + raw["ramp"] + raw.get("settle", 0.0),
                                        raw["stop_at"])), **raw["cpu"]},
           "client": {"procs": raw["procs"], "cpu_cores": round(sum(cpu_s) / span, 2),
                      "busiest_proc_cpu_share": round(max(cpu_s) / span, 2)}}
    if raw["clients"] == 1:  # for the batch-1 comparison: what client 0 sent, in order
        out["_client0"] = sorted((r[1], r[4], r[5]) for r in reqs)
        out["_sent"] = 1 + max((r[1] for r in reqs), default=-1)
    return out


def _median(vals: list[Any]) -> Any:
    nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(nums) if nums else vals[0]


def median_level(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from several rounds: each figure's median (errors summed). A shared
    machine's noise hits single rounds; the median of an odd count is one of them."""
    if len(rounds) == 1:
        return {k: v for k, v in rounds[0].items() if k != "round"}
    out: dict[str, Any] = {}
    for key, first in rounds[0].items():
        if key == "round":
            continue
        if key.startswith("_") or key in ("first_error", "mix", "engine_mode"):
            out[key] = first
        elif key in ("errors", "health_failures"):
            out[key] = sum(r[key] for r in rounds)
        elif key == "error_kinds":
            out[key] = dict(sum((Counter(r[key]) for r in rounds), Counter()))
        elif isinstance(first, dict):
            out[key] = {k: _median([r[key].get(k) for r in rounds]) for k in first}
        else:
            out[key] = _median([r[key] for r in rounds])
    out["rounds"] = len(rounds)
    return out


def _target(name: str, mix: str, mode: str, value: Any, threshold: Any, met: bool | None,
            **extra: Any) -> dict[str, Any]:
    return {"target": name, "mix": mix, "engine_mode": mode, "value": value,
            "threshold": threshold, "met": met, **extra}


def targets(levels: list[dict[str, Any]], ratios: list[dict[str, Any]],
            health_stall_ms: float) -> list[dict[str, Any]]:
    """Issue #16's serving targets for every (mix, engine mode) measured; ``met`` is None
    where the run lacks the level a target needs. The issue judges them on the issue mix."""
    out = []
    for mix, mode in dict.fromkeys((lv["mix"], lv["engine_mode"]) for lv in levels):
        group = sorted((lv for lv in levels if (lv["mix"], lv["engine_mode"]) == (mix, mode)),
                       key=lambda lv: lv["clients"])
        at = {lv["clients"]: lv for lv in group}
        tok = at.get(256, {}).get("tok_per_s")
        gap = at.get(256, {}).get("gap_p50_ms")
        out.append(_target("256 clients: output tok/s >= 30,000", mix, mode, tok, TOK_AT_256,
                           None if tok is None else tok >= TOK_AT_256))
        out.append(_target("256 clients: gap p50 <= 10 ms", mix, mode, gap, GAP_P50_AT_256_MS,
                           None if gap is None else gap <= GAP_P50_AT_256_MS))
        r = next((x for x in ratios if (x["mix"], x["engine_mode"]) == (mix, mode)), None)
        v = None if r is None else r["ratio"]
        out.append(_target("1 client through HTTP >= 90% of the engine's batch-1 rate", mix,
                           mode, v, HTTP_OVER_ENGINE, None if v is None else v >= HTTP_OVER_ENGINE))
        seq = [lv["tok_per_s"] for lv in group if lv["clients"] <= 512]
        steps = [b / a for a, b in zip(seq, seq[1:]) if a]
        worst = round(min(steps), 3) if steps else None
        out.append(_target("throughput never falls as clients are added (to 512)", mix, mode,
                           worst, 1 - FLAT_TOLERANCE,
                           None if worst is None else worst >= 1 - FLAT_TOLERANCE,
                           tok_per_s=seq, clients=[lv["clients"] for lv in group]))
        hmax = max(lv["health_max_ms"] for lv in group)
        fails = sum(lv["health_failures"] for lv in group)
        out.append(_target("health never stalls", mix, mode, hmax, health_stall_ms,
                           hmax <= health_stall_ms and fails == 0, health_failures=fails))
        errs = sum(lv["errors"] for lv in group)
        out.append(_target("no errors", mix, mode, errs, 0, errs == 0))
    return out


def table(levels: list[dict[str, Any]], ratios: list[dict[str, Any]],
          goals: list[dict[str, Any]]) -> None:
    head = (f"{'mix':>6} {'engine':>10} {'clients':>7} {'tok/s':>9} {'ttft p50':>9} "
            f"{'ttft p99':>9} {'gap p50':>8} {'gap p99':>8} {'health':>7} {'err':>4} "
            f"{'steps/s':>8} {'eng tok/s':>10} {'running':>8} {'preempt':>7} {'front':>6} "
            f"{'engine':>6} {'client':>6}")
    print(head)
    for lv in levels:
        e = lv["engine"]
        w = e.get("window") or e  # steps/s and eng tok/s of the steady window, if sampled
        print(f"{lv['mix']:>6} {lv['engine_mode']:>10} {lv['clients']:>7} {lv['tok_per_s']:>9} "
              f"{lv['ttft_p50_ms']!s:>9} {lv['ttft_p99_ms']!s:>9} {lv['gap_p50_ms']!s:>8} "
              f"{lv['gap_p99_ms']!s:>8} {lv['health_max_ms']:>7} {lv['errors']:>4} "
              f"{w['steps_per_s']:>8} {w.get('rows_per_s', e['tok_per_s'])!s:>10} "
              f"{e['mean_running']!s:>8} "
              f"{e['preemptions']:>7} {e.get('front_cpu_cores', '-')!s:>6} "
              f"{e.get('engine_cpu_cores', '-')!s:>6} {lv['client']['cpu_cores']:>6}")
    preempted = [lv["clients"] for lv in levels if lv["engine"]["preemptions"]]
    if preempted:
        print(f"preemptions at {sorted(set(preempted))} clients: the KV pool is too small for "
              f"them, so those levels measure preemption (see --num-pages)")
    for r in ratios:
        print(f"{r['mix']} {r['engine_mode']}: 1 client {r['http_tok_per_s']} tok/s through "
              f"HTTP, engine batch-1 {r['engine_tok_per_s']} tok/s: ratio {r['ratio']}")
    for g in goals:
        mark = {True: "met", False: "NOT met", None: "n/a"}[g["met"]]
        print(f"[{mark:>7}] {g['mix']}/{g['engine_mode']}: {g['target']}: {g['value']}")
