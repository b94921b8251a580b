"""A graph replay's kernels as Nsight Systems saw them, with PDL overlap: how far each launch
moves the step's end, grouped by kernel and grid.

    nsys profile --cuda-graph-trace=node -o REP python3 bench/launch_bound.py --kinds whole
    nsys stats -r cuda_gpu_trace -f csv -o REP REP.nsys-rep
    python3 bench/nsys_step_table.py REP_cuda_gpu_trace.csv [--first embed] [--replays 3]
        [--json OUT.json]

Why not Nsight Compute (bench/ncu_step.sh): it runs each kernel alone, so a launch's time
there includes what PDL hides in a replay (the next kernel's CTAs resident and waiting while
this one drains). Here a kernel's cost is end_i - end_(i-1): how much later the step's
frontier is because of it, which sums to the replay's span. A replay is the run of kernels
from one launch of the ``--first`` kernel (the step's first: the embedding) to the next; the
last ``--replays`` whole replays are averaged (earlier ones include captures and eager
warm-ups).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from typing import Any


def kernels(path: str) -> list[dict[str, Any]]:
    """Kernel rows (start and end in ns, name, grid) in start order; copies and memsets out."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            start = row.get("Start (ns)") or row.get("Start")
            dur = row.get("Duration (ns)") or row.get("Duration")
            name = row.get("Name", "")
            if not start or not dur or name.startswith("[CUDA"):
                continue
            grid = tuple(int(row.get(k) or 0) for k in ("GrdX", "GrdY", "GrdZ"))
            s = int(float(start))
            out.append({"start": s, "end": s + int(float(dur)), "name": short(name),
                        "grid": grid})
    return sorted(out, key=lambda k: k["start"])


def short(name: str) -> str:
    """The kernel's name with its template arguments, without the parameter list."""
    return re.sub(r"\(.*\)$", "", name).replace("void ", "").strip()


def replays(rows: list[dict[str, Any]], first: str) -> list[list[dict[str, Any]]]:
    starts = [i for i, k in enumerate(rows) if k["name"].startswith(first)]
    return [rows[a:b] for a, b in zip(starts, starts[1:])]


def table(replay_list: list[list[dict[str, Any]]]) -> dict[str, Any]:
    per: dict[tuple[str, tuple[int, ...]], list[float]] = defaultdict(list)
    spans = []
    for rep in replay_list:
        frontier = rep[0]["start"]
        spans.append((max(k["end"] for k in rep) - rep[0]["start"]) / 1e3)
        for k in rep:
            end = max(frontier, k["end"])
            per[(k["name"], k["grid"])].append((end - frontier) / 1e3)
            frontier = end
    n = len(replay_list)
    rows = [{"kernel": name, "grid": list(grid), "launches": len(v) // n,
             "us_per_step": round(sum(v) / n, 2), "us_each": round(sum(v) / len(v), 2)}
            for (name, grid), v in per.items()]
    rows.sort(key=lambda r: -r["us_per_step"])
    span = sum(spans) / n
    for r in rows:
        r["share"] = round(r["us_per_step"] / span, 4)
    return {"replays": n, "span_us": round(span, 1),
            "launches_per_step": sum(len(r) for r in replay_list) // n, "kernels": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--first", default="embed")
    p.add_argument("--replays", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    reps = replays(kernels(args.csv), args.first)
    if len(reps) < args.replays:
        raise SystemExit(f"nsys_step_table: {len(reps)} whole replays, {args.replays} asked")
    t = table(reps[-args.replays:])
    print(f"{t['span_us']:.1f} us a step, {t['launches_per_step']} launches")
    for r in t["kernels"]:
        print(f"{r['us_per_step']:8.1f} us {100 * r['share']:5.1f}%  {r['launches']:3d} x "
              f"{r['us_each']:6.2f}  {r['kernel'][:70]} {tuple(r['grid'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": args.csv, **t}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
