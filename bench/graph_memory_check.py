"""The CUDA graphs' memory bound under the chat mix (backend/cupy_memory.py), on the GPU,
with random weights of the default model's shapes (no model file needed).

    python3 bench/graph_memory_check.py [--requests 1500] [--json PATH]

The serving sweep's chat mix once failed every step after a few seconds on an H100: the
KV pool took 0.9 of the free memory, the graphs' private pools took the rest as the
mix's growing histories kept making new graph keys, and eager steps found no room for
their logits (bench/serve-sweep-chat-oom-h100.log). This runs that mix (prompts 20-2,000
tokens, outputs 16-512, log-normal, ``ignore_eos``) through an embedded engine sized like
``llm-engine serve`` (default pool, token budget 1,024, 1,024-row mixed graphs, 512
running), in rounds on one engine so that keys keep accumulating, and reports per round
the graphs held, the device memory free, the guard's drops and retries, and failures.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from common import SMOLLM2, write_json
from throughput_workload import MIXES, requests

from crucible import LLM
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="bench/graph-memory-check.json")
    a = p.parse_args(argv)
    import cupy as cp

    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    llm = LLM(model, settings=Settings(device="cuda", token_budget=1024, max_running=512,
                                       mixed_graph_rows=1024))
    be = llm.engine.runner.backend
    ids = list(range(model.config.vocab_size))
    rows = []
    for r in range(a.rounds):
        _, _, prompts, params = requests("chat", a.requests, MIXES["chat"],
                                         model.config.max_context, ids, random.Random(r), 0.7)
        t0, error = time.perf_counter(), None
        try:
            outs = llm.generate(prompts, params)
            tokens = sum(len(o.token_ids) for o in outs)
        except Exception as exc:  # what the guard is there to prevent: reported, not hidden
            error, tokens = f"{type(exc).__name__}: {exc}", 0
        free, total = cp.cuda.runtime.memGetInfo()
        g = be.memory
        row = {"round": r, "wall_s": round(time.perf_counter() - t0, 2), "tokens": tokens,
               "error": error, "free_gib": round(free / 2**30, 2),
               "total_gib": round(total / 2**30, 2), "headroom_gib": round(g.headroom / 2**30, 2),
               "graphs_held": {"decode_pairs": len(be.graphs.graphs),
                               "prefill": len(be.prefill_graphs.graphs),
                               "mixed": len(be.mixed_graphs.graphs)},
               "captures_given_up": be.prefill_graphs.num_out_of_memory
               + be.mixed_graphs.num_out_of_memory + be.graphs.num_out_of_memory,
               "graphs_dropped": g.num_dropped, "step_retries": g.num_retries,
               "pages_free": llm.engine.allocator.num_free,
               "pages_total": llm.engine.allocator.num_pages, **be.graph_stats()}
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
        if error:
            break
    write_json(a.json, {"command": "python3 bench/graph_memory_check.py "
                        + " ".join(argv or sys.argv[1:]), "device": cp.cuda.runtime
                        .getDeviceProperties(0)["name"].decode(), "rounds": rows})
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
