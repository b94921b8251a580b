"""The table of bench/attention_budget_ab.sh's runs: per attention budget, the chat bench's
TTFT p50 with the cache on and off, their ratio, total tok/s and steps (median and min-max
over rounds), and the 256-client chat mix's output tok/s, TTFT and gap p50.

    python3 bench/attention_budget_report.py OUT_DIR [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from statistics import median
from typing import Any


def spread(xs: list[float]) -> dict[str, float] | None:
    return {"median": round(median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3), "n": len(xs)} if xs else None


def chat_figures(path: Path) -> dict[str, float]:
    runs = {r["config"]: r["figures"] for r in json.loads(path.read_text())["runs"]["chat"]}
    on, off = runs["on"], runs["off"]
    return {"on_ttft_p50_ms": on["ttft_p50_ms"], "off_ttft_p50_ms": off["ttft_p50_ms"],
            "ratio_off_over_on": off["ttft_p50_ms"] / on["ttft_p50_ms"],
            "on_ttft_p99_ms": on["ttft_p99_ms"], "on_total_tok_per_s": on["total_tok_per_s"],
            "on_steps": on["steps"], "off_steps": off["steps"]}


def serve_figures(path: Path) -> dict[str, float]:
    lv = json.loads(path.read_text())["levels"][0]
    return {"tok_per_s": lv["tok_per_s"], "ttft_p50_ms": lv["ttft_p50_ms"],
            "gap_p50_ms": lv["gap_p50_ms"], "gap_p99_ms": lv["gap_p99_ms"],
            "errors": lv["errors"]}


def collect(out: Path) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for kind, read in (("chat", chat_figures), ("serve", serve_figures)):
        runs: dict[str, list[dict[str, float]]] = {}
        for p in sorted(out.glob(f"{kind}-*-*.json")):
            m = re.fullmatch(rf"{kind}-(\d+)-(\d+)\.json", p.name)
            if m:
                runs.setdefault(m.group(1), []).append(read(p))
        for budget, figs in runs.items():
            entry = table.setdefault(budget, {})
            entry[kind] = {k: spread([f[k] for f in figs]) for k in figs[0]}
    return dict(sorted(table.items(), key=lambda kv: int(kv[0])))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    table = collect(args.out)
    for budget, entry in table.items():
        c, s = entry.get("chat", {}), entry.get("serve", {})
        line = f"budget {budget:>8}"
        for k in ("on_ttft_p50_ms", "off_ttft_p50_ms", "ratio_off_over_on", "on_total_tok_per_s",
                  "on_steps"):
            if c.get(k):
                line += f"  {k} {c[k]['median']:.4g} [{c[k]['min']:.4g}-{c[k]['max']:.4g}]"
        for k in ("tok_per_s", "gap_p50_ms", "errors"):
            if s.get(k):
                line += f"  serve {k} {s[k]['median']:.4g}"
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "budgets": table},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
