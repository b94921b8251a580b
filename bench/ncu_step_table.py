"""Per-kernel times of one eager step from Nsight Compute's CSV (bench/ncu_step.sh).

    python3 bench/ncu_step_table.py NCU.csv --steps 2 --json OUT.json

ncu times each launch alone (serialised, no overlap between kernels, so no programmatic
dependent launch either): the sum is an upper bound on the step's GPU time, and the table
says which kernels the step's time is made of. The CSV holds ``--steps`` identical steps;
the last one is kept (the first pays compiles and first-use costs).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict


def rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        text = [ln for ln in f if ln.startswith('"')]  # ncu's own log lines are not CSV
    return list(csv.DictReader(text))


def launches(recs: list[dict[str, str]]) -> list[dict[str, object]]:
    """One entry per launch (ncu writes one CSV row per metric)."""
    by_id: dict[str, dict[str, object]] = {}
    for r in recs:
        e = by_id.setdefault(r["ID"], {"kernel": r["Kernel Name"].split("(")[0],
                                      "grid": r.get("Grid Size", ""),
                                      "block": r.get("Block Size", "")})
        v = r["Metric Value"].replace(",", "")
        unit = r.get("Metric Unit", "")
        if r["Metric Name"] == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
            e["us"] = float(v) * scale
        else:
            e[r["Metric Name"]] = v
    return [by_id[k] for k in sorted(by_id, key=int)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--note", default="")
    a = p.parse_args(argv)
    all_l = launches(rows(a.csv))
    if not all_l or len(all_l) % a.steps:
        print(f"{len(all_l)} launches do not split into {a.steps} steps", file=sys.stderr)
    step = all_l[len(all_l) - len(all_l) // a.steps:]
    total = sum(float(e.get("us", 0.0)) for e in step)
    agg: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for e in step:
        agg[(str(e["kernel"]), str(e["grid"]), str(e["block"]))].append(float(e.get("us", 0)))
    table = sorted(({"kernel": k, "grid": g, "block": b, "launches": len(v),
                     "us_total": round(sum(v), 2), "us_each": round(sum(v) / len(v), 2),
                     "share": round(sum(v) / total, 4) if total else 0.0}
                    for (k, g, b), v in agg.items()), key=lambda d: -d["us_total"])
    for t in table:
        print(f"{t['us_total']:9.1f} us {t['share']:6.1%} {t['launches']:4d} x "
              f"{t['us_each']:7.2f}  {t['kernel']} grid {t['grid']} block {t['block']}")
    print(f"{total:9.1f} us in {len(step)} launches (one step, each launch alone)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"note": a.note, "launches_per_step": len(step),
                       "step_us_serialised": round(total, 1), "kernels": table,
                       "sequence": [{"kernel": e["kernel"], "us": round(float(e.get("us", 0)), 2)}
                                    for e in step]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
