"""How full the serving chat mix's steps are, simulated: no GPU, no engine, only the
scheduler's rules and the mix's lengths, to tell how much of a mixed graph's rows are
padding (rows rounded up to cupy_mixed_graphs.TOKEN_BUCKETS).

    python3 bench/step_fill_sim.py [--clients 256] [--budget 1024] [--steps 20000]
        [--json PATH]

Each client sends its next request the moment its last one ends (no HTTP latency); a
request's prompt and output lengths are the chat mix's (bench/throughput_workload.py
``lengths``: log-normal, median 300 and 150, clipped to 20-2000 and 16-512). Per step: decodes
first (one row each), then prefill in arrival order up to the token budget, as
engine/scheduler.py plans. The first 10% of steps (the start) are left out. Figures: mean
rows a step, the share of steps at the full budget, and the padding share of the graphs'
rows (at the buckets, and at a 64-row granularity for comparison).
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import sys

import numpy as np
from throughput_workload import MIXES, lengths

from crucible.backend.cupy_mixed_graphs import TOKEN_BUCKETS

CONTEXT = 8192  # the default model's


def simulate(clients: int, budget: int, steps: int, seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)

    def request() -> list[int]:
        return list(lengths("chat", 1, MIXES["chat"], CONTEXT, rng)[0][0])

    running = [request() for _ in range(clients)]  # [prompt rows left, tokens left]
    rows_of: list[int] = []
    for step in range(steps):
        decodes = [r for r in running if r[0] == 0]
        rows, left = len(decodes), budget - len(decodes)
        for r in running:
            if r[0] > 0 and left > 0:
                n = min(r[0], left)
                r[0] -= n
                left -= n
                rows += n
                if r[0] == 0:
                    r[1] -= 1  # its first token
        for r in decodes:
            r[1] -= 1
        ended = sum(1 for r in running if r[0] == 0 and r[1] <= 0)
        running = [r for r in running if not (r[0] == 0 and r[1] <= 0)]
        running += [request() for _ in range(ended)]
        if step >= steps // 10:
            rows_of.append(rows)
    rows_a = np.array(rows_of)
    padded = np.array([TOKEN_BUCKETS[bisect.bisect_left(TOKEN_BUCKETS, r)] for r in rows_of])
    by64 = np.ceil(rows_a / 64) * 64
    return {"mean_rows": round(float(rows_a.mean()), 1),
            "full_budget_share": round(float((rows_a == budget).mean()), 3),
            "padding_share_buckets": round(float(1 - rows_a.sum() / padded.sum()), 4),
            "padding_share_64": round(float(1 - rows_a.sum() / by64.sum()), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = simulate(args.clients, args.budget, args.steps)
    print(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python3 bench/step_fill_sim.py " + " ".join(sys.argv[1:]),
                       **res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
