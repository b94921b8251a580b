"""The engine's own batch-1 rate, for bench/serve_clients.py's ``http_1_client_over_engine``.

The HTTP servers are stopped first, so the device and its memory are free. Then one
in-process ``crucible.LLM`` is built with the same model, device and settings the servers
got. For each mix it runs the requests client 0 of the 1-client level sent
(serve_mixes.bodies with the same key: the same prompts and the same ``max_tokens``). They
run one at a time, back to back, through ``LLM.generate``. The time per request therefore
includes its prefill, as the HTTP client's does. Text prompts go in as text, and the LLM
tokenises them with the same ``encode`` the server runs. The prompt token counts are
checked against the usage the server returned (``prompt_tokens_match``).

A warm-up runs first, as it does for the servers (not timed): ``warmup_clients`` requests of
the mix in one batch, which finish at different times and so pass through every smaller
batch size, and then two single requests. On CUDA the graph counters of the timed part
are reported, and their captures should be 0.
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice
from typing import Any

from throughput_measure import graph_counters

from crucible import LLM, SamplingParams
from serve_mixes import Served, bodies, level_key, warmup_key


def build(args: argparse.Namespace) -> tuple[LLM, float]:
    """An LLM with the servers' settings (serve_clients.server_command passes the same)."""
    t0 = time.monotonic()
    llm = LLM(args.model, device=args.device, weights=args.weights, num_pages=args.num_pages,
              gpu_memory_fraction=args.gpu_memory_fraction, token_budget=args.token_budget,
              chunk_cap=args.chunk_cap, max_running=args.max_running, max_queue=args.max_queue,
              seed=0)
    return llm, time.monotonic() - t0


def _params(body: dict[str, Any]) -> SamplingParams:
    return SamplingParams(max_tokens=body["max_tokens"], temperature=body["temperature"],
                          ignore_eos=body["ignore_eos"])


def run_mix(llm: LLM, mix: str, served: Served, count: int, repeats: int,
            warmup_clients: int) -> dict[str, Any]:
    """``count`` requests of the 1-client sequence, back to back, ``repeats`` times."""
    t0 = time.monotonic()
    warm = list(islice(bodies(mix, warmup_key(mix, 9, 0), served), warmup_clients + 2))
    llm.generate([b["prompt"] for b in warm[:warmup_clients]],
                 [_params(b) for b in warm[:warmup_clients]])
    for b in warm[warmup_clients:]:
        llm.generate(b["prompt"], _params(b))
    warm_s = time.monotonic() - t0
    seq = list(islice(bodies(mix, level_key(mix, 1, 0), served), count))
    g0 = graph_counters(llm)
    runs = []
    for _ in range(repeats):
        marks, prompt_tokens, output_tokens = [time.monotonic()], [], []
        for b in seq:
            out = llm.generate(b["prompt"], _params(b))[0]
            marks.append(time.monotonic())
            prompt_tokens.append(len(out.prompt_token_ids))
            output_tokens.append(len(out.token_ids))
        runs.append({"marks": marks, "prompt_tokens": prompt_tokens,
                     "output_tokens": output_tokens})
    g1 = graph_counters(llm)
    return {"mix": mix, "requests": count, "repeats": repeats,
            "warmup": {"requests": len(warm), "batched": warmup_clients,
                       "wall_s": round(warm_s, 3)},
            "timed_graph_counters": {k: g1[k] - g0.get(k, 0) for k in g1},
            "_runs": runs}


def rate(run: dict[str, Any], k: int) -> float:
    """Generated tokens over wall time of the first ``k`` requests of one repeat."""
    k = min(k, len(run["output_tokens"]))
    wall = run["marks"][k] - run["marks"][0]
    return sum(run["output_tokens"][:k]) / wall if wall > 0 else 0.0


def summary(b1: dict[str, Any]) -> dict[str, Any]:
    """The JSON's view of one mix's run (without the per-request marks)."""
    runs = b1["_runs"]
    rates = [rate(r, b1["requests"]) for r in runs]
    walls = [r["marks"][-1] - r["marks"][0] for r in runs]
    return {k: v for k, v in b1.items() if not k.startswith("_")} | {
        "tokens": sum(runs[0]["output_tokens"]) if runs else 0,
        "prompt_tokens": sum(runs[0]["prompt_tokens"]) if runs else 0,
        "wall_s": round(statistics.median(walls), 3) if walls else None,
        "tok_per_s": round(statistics.median(rates), 1) if rates else None,
        "tok_per_s_repeats": [round(x, 1) for x in rates]}


def compare(level: dict[str, Any], b1: dict[str, Any]) -> dict[str, Any]:
    """The 1-client level against the engine over the same first requests."""
    k = level["_sent"]
    engine = statistics.median(rate(r, k) for r in b1["_runs"])
    http_prompts = [p for _, p, _ in level["_client0"]]
    engine_prompts = b1["_runs"][0]["prompt_tokens"][:k]
    http = level["span_tok_per_s"]
    return {"mix": level["mix"], "engine_mode": level["engine_mode"], "requests": k,
            "http_tok_per_s": http, "engine_tok_per_s": round(engine, 1),
            "ratio": round(http / engine, 3) if engine and http else None,
            "prompt_tokens_match": http_prompts == engine_prompts,
            "output_tokens_match": [o for _, _, o in level["_client0"]]
            == b1["_runs"][0]["output_tokens"][:k]}
