"""How many mixed-graph keys the prefix cache's chat workload makes, and how many of its
timed steps would capture or run eagerly under the tree's key rule; on the CPU.

    python3 bench/chat_graph_keys.py [--users 64 --turns 8] [--json bench/x.json]

The real scheduler runs bench/prefix_chat.py's workload (cache on, serve's token budget of
1,024, a warm-up of as many turns with other prompts, then the timed turns) on a tiny
random model; every step is run through MixedGraphs' key and capture rule at 1,024 graph
rows without a GPU, as bench/mixed_graph_keys.py does for the throughput workloads. The
capacity classes come from tests/test_capacity_classes.py's occupancy model (228 KiB an
SM, the kernels' register bounds, 132 SMs). To compare two rules, run it in each tree
(``git archive <commit> | tar -x -C DIR``, then ``cd DIR``).

Per part (warm-up, timed): keys, captures, replays, eager steps. A capture or an
eager step inside the timed part lands on some request's time to first token (~15 ms and
~7 ms of host time on the H200, docs/prefix-cache.md); a replay costs ~1 ms. The CPU
engine does not pipeline, so a step may hold a request one step apart from the GPU
engine's; the counts, not the exact steps, are the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_json  # noqa: E402
from mixed_graph_keys import CaptureRule, spy_steps  # noqa: E402
from prefix_chat import add_chat_args, chat_run, conversations  # noqa: E402

from crucible import LLM, SamplingParams  # noqa: E402
from crucible.backend import cupy_mixed_graphs as mg  # noqa: E402
from crucible.kernels.capacity import CapacityClasses  # noqa: E402
from crucible.kernels.variants import LaunchPlan, decode_static_bytes, parse_variant  # noqa: E402
from crucible.model.tiny import tiny_random_model  # noqa: E402

SM_SMEM, RESERVED, OPTIN, SMS = 233472, 1024, 232448, 132


def occupancy(plan: LaunchPlan) -> int:
    static = decode_static_bytes(plan.decode_heads) if plan.decode else 0
    return min(2 if plan.prefetch else 3, SM_SMEM // (plan.smem_bytes + static + RESERVED))


def record(args: argparse.Namespace) -> tuple[list[Any], int]:
    """Every PackedBatch of the warm-up and the timed turns; and where the timed ones start."""
    model = tiny_random_model(seed=0, weights="f32", max_context=8192)
    llm = LLM(model, device="cpu", token_budget=1024)
    stops = set(llm.tokenizer.stop_token_ids)
    ids = [t for t in range(model.config.vocab_size) if t not in stops]
    work = conversations(args, ids, args.seed, args.turns)
    warm = conversations(args, ids, args.seed + 1_000_003, args.turns)
    batches = spy_steps(llm)
    params = SamplingParams(max_tokens=args.reply_tokens, temperature=0, ignore_eos=True)
    asyncio.run(chat_run(llm, *warm, params))
    start = len(batches)
    asyncio.run(chat_run(llm, *work, params))
    return batches, start


def simulate(batches: list[Any], start: int, classes: CapacityClasses) -> dict[str, Any]:
    graphs = SimpleNamespace(classes=SimpleNamespace(get=lambda: classes))
    rule = CaptureRule()
    out = {"warmup": Counter(), "timed": Counter()}
    keys = {"warmup": set(), "timed": set()}
    for i, b in enumerate(batches):
        part = "warmup" if i < start else "timed"
        if not mg.is_mixed_graph_step(b, 1024):
            continue
        key = mg.MixedGraphs.key(graphs, b)  # type: ignore[arg-type]
        keys[part].add(key)
        out[part][rule(key)] += 1
    return {p: dict(keys=len(keys[p]), **dict(sorted(out[p].items()))) for p in out} | \
        {"graphs_held": len(rule.held)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_chat_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    batches, start = record(a)
    classes = CapacityClasses(9, 3, parse_variant("exact-q4-k64"), 8192, OPTIN, SMS, occupancy)
    result = simulate(batches, start, classes)
    print(result)
    if a.json:
        write_json(a.json, dict(command=" ".join(["python3", *sys.argv]), steps=len(batches),
                                timed_from=start, result=result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
