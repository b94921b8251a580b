"""The CPU throughput target, measured against another commit in the same run.

The workload of the throughput issue's CPU item: 256 requests of the tiny random model
(prompts 16-95 random ids, outputs 32-95 tokens, greedy, ``ignore_eos``), all handed to one
``LLM.generate``, a pool big enough for all of them at once. Each round runs it once in a
fresh process per tree, alternating the order (A then B, B then A), and reports each tree's
tok/s and the paired ratio B/A with median and min-max. The tokens of both trees must be
identical (their digest is compared), so a faster tree that computes something else fails.

    python3 bench/throughput_ab.py --base /tmp/base --candidate . --rounds 6 \
        --json bench/throughput-cpu-ab.json

``--base`` is a checkout of the older commit (``git worktree add /tmp/base REV``) with its
compiled CPU kernels built in place (``python3 setup.py build_ext --inplace``). Only the API
both trees share is used: ``LLM(model, device=, max_queue=, num_pages=)`` and ``generate``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOAD = r"""
import hashlib, json, time
import numpy as np
from crucible import LLM, SamplingParams
from crucible.model.tiny import tiny_random_model
m = tiny_random_model(seed=0)
llm = LLM(m, device="cpu", max_queue=1024, num_pages=4096)
rng = np.random.default_rng(0)
prompts = [rng.integers(0, m.config.vocab_size, int(rng.integers(16, 96))).tolist()
           for _ in range(256)]
params = [SamplingParams(max_tokens=int(rng.integers(32, 96)), ignore_eos=True,
                         temperature=0) for _ in range(256)]
llm.generate(prompts[:8], params[:8])  # warm-up, not timed
t0, s0 = time.perf_counter(), llm.engine.num_steps
outs = llm.generate(prompts, params)
dt = time.perf_counter() - t0
tokens = sum(map(len, prompts)) + sum(len(o.token_ids) for o in outs)
digest = hashlib.sha256(repr([o.token_ids for o in outs]).encode()).hexdigest()[:16]
print(json.dumps({"tok_s": tokens / dt, "wall_s": dt, "tokens": tokens,
                  "steps": llm.engine.num_steps - s0, "digest": digest}))
"""


def run(tree: Path) -> dict:
    # cwd too: ``python -c`` puts the working directory first on the import path.
    out = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True,
                         cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the older tree (A)")
    p.add_argument("--candidate", type=Path, default=Path("."), help="the newer tree (B)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    a_runs, b_runs = [], []
    for r in range(args.rounds):
        order = [("a", args.base), ("b", args.candidate)]
        for name, tree in order if r % 2 == 0 else order[::-1]:
            (a_runs if name == "a" else b_runs).append(run(tree.resolve()))
    same = len({x["digest"] for x in a_runs + b_runs}) == 1
    ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(a_runs, b_runs)]
    result = {
        "command": "python3 " + " ".join(sys.argv),
        "workload": "256 requests, tiny random model, prompts 16-95, outputs 32-95, greedy",
        "base": {"tok_s": spread([x["tok_s"] for x in a_runs]), "runs": a_runs},
        "candidate": {"tok_s": spread([x["tok_s"] for x in b_runs]), "runs": b_runs},
        "ratio": spread(ratios), "identical_tokens": same,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"base       {result['base']['tok_s']['median']:>10.0f} tok/s")
    print(f"candidate  {result['candidate']['tok_s']['median']:>10.0f} tok/s")
    r = result["ratio"]
    print(f"ratio      {r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}], identical tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
