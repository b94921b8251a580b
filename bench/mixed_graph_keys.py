"""How the mixed-step CUDA graphs' policy (backend/cupy_mixed_graphs.py) meets a workload's
steps, on the CPU: the real scheduler runs the throughput bench's workload on a tiny random
model, and every step is run through the graphs' key and capture rule at each
``--max-tokens`` without a GPU.

    python3 bench/mixed_graph_keys.py [--workload random] [--requests 1000] \\
        [--max-tokens 512,1024] [--json bench/x.json]

Per max_tokens, over the steps that qualify for a mixed graph (is_mixed_graph_step): how
many keys there are, how many steps capture, replay or run eagerly (a key seen fewer than
CAPTURE_AFTER times, or MAX_GRAPHS already held), by size (up to 512 rows, past 512), and
the padding a replay adds (bucket rows over real rows, final rows likewise: the LM head
runs on the padded finals). Steps past max_tokens and those with other graphs (pure decode,
lone prefill) are counted apart. A step's shape depends on the scheduler alone (token
budget, max_running, lengths), not on the model, so the tiny model gives the engine's
steps; the GPU engine's pipelining can shift a step by one, not the mix.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

from common import write_json
from throughput_workload import MIXES, requests

from crucible import LLM
from crucible.backend import cupy_mixed_graphs as mg
from crucible.model.tiny import tiny_random_model


def record_steps(workload: str, n: int, seed: int, budget: int, max_running: int | None,
                 context: int) -> list[Any]:
    """Every PackedBatch the engine runs for the workload (tiny model, CPU)."""
    model = tiny_random_model(seed=0, weights="f32", max_context=context)
    llm = LLM(model, device="cpu", token_budget=budget, max_running=max_running,
              num_pages=(max_running or budget // 2) * (-(-context // 16)))
    stops = set(llm.tokenizer.stop_token_ids)
    ids = [t for t in range(model.config.vocab_size) if t not in stops]
    _, _, prompts, params = requests(workload, n, MIXES[workload], context, ids,
                                     random.Random(seed), 1.0)
    batches = spy_steps(llm)
    llm.generate(prompts, params)
    return batches


def spy_steps(llm: LLM) -> list[Any]:
    """A list that every PackedBatch ``llm``'s backend runs from now on is appended to."""
    backend, batches = llm.engine.runner.backend, []
    run_step = backend.run_step

    def spy(batch: Any, *a: Any, **k: Any) -> Any:
        batches.append(batch)
        return run_step(batch, *a, **k)

    backend.run_step = spy
    return batches


class CaptureRule:
    """MixedGraphs' capture policy (cupy_graph_cache.GraphCache._graph) without a device:
    ``rule(key)`` is what a step of that key does, "replay", "capture" or "eager"."""

    def __init__(self) -> None:
        self.held: set = set()
        self.seen: Counter = Counter()

    def __call__(self, key: Any) -> str:
        if key in self.held:
            return "replay"
        self.seen[key] += 1
        if self.seen[key] < mg.CAPTURE_AFTER or len(self.held) >= mg.MAX_GRAPHS:
            return "eager"
        self.held.add(key)
        return "capture"


def simulate(batches: list[Any], max_tokens: int) -> dict[str, Any]:
    """The capture rule over the steps, as MixedGraphs.run applies it (no GPU)."""
    rule = CaptureRule()
    out: Counter = Counter()
    rows_real = Counter()
    rows_padded = Counter()
    finals_real = Counter()
    finals_padded = Counter()
    keys = set()
    for b in batches:
        size = "le512" if b.num_rows <= 512 else "gt512"
        if not mg.is_mixed_graph_step(b, max_tokens):
            out[f"other_{size}"] += 1
            continue
        # the batch alone, capacities in powers of two (no device for the classes)
        key = mg.MixedGraphs.key(SimpleNamespace(classes=None), b)  # type: ignore[arg-type]
        keys.add(key)
        what = rule(key)
        out[f"{what}_{size}"] += 1
        if what in ("replay", "capture"):
            rows_real[size] += b.num_rows
            rows_padded[size] += key[0]
            finals_real[size] += int(b.final_rows.shape[0])
            finals_padded[size] += key[1]
    pad = {s: dict(rows=rows_padded[s] / max(rows_real[s], 1),
                   finals=finals_padded[s] / max(finals_real[s], 1))
           for s in ("le512", "gt512") if rows_real[s]}
    return dict(max_tokens=max_tokens, steps=len(batches), keys=len(keys),
                graphs_held=len(rule.held), outcomes=dict(sorted(out.items())), padding=pad)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=tuple(MIXES), default="random")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--max-running", type=int, default=None)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--max-tokens", default="512,1024")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    batches = record_steps(a.workload, a.requests, a.seed, a.token_budget, a.max_running,
                           a.context)
    results = [simulate(batches, int(m)) for m in a.max_tokens.split(",")]
    for r in results:
        print(f"max_tokens {r['max_tokens']}: {r['steps']} steps, {r['keys']} keys, "
              f"{r['graphs_held']} graphs; {r['outcomes']}; padding {r['padding']}")
    if a.json:
        write_json(a.json, dict(command=" ".join(["python3", *sys.argv]), workload=a.workload,
                                requests=a.requests, token_budget=a.token_budget,
                                results=results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
