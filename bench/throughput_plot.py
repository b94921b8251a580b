"""Tokens/s against running requests, for bench/throughput.py.

    python bench/throughput_plot.py bench/throughput-cpu-tiny.json [out.png]

``bin_by_running`` groups the timed run's engine steps by how many requests were running in
them; a bin's tok/s is its rows (prompt and decode tokens computed) over its steps' wall
time, so a bin of many short steps and one of few long steps weigh by time, not by count.
The drawing is serve_plot.plot's: matplotlib when it imports, else its stdlib PNG
rasterizer (axes from zero with their end values, series numbered by colour).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_plot import plot  # noqa: E402

# One engine.step call: (wall seconds, rows computed, launches, running requests).
StepSample = tuple[float, int, int, int]


def bin_by_running(samples: Sequence[StepSample], max_bins: int = 32) -> list[dict[str, Any]]:
    """Steps grouped by running requests, in bins of one power-of-two width (1 when few
    counts); ``running_max`` is the most seen in the bin."""
    live = [s for s in samples if s[2] > 0]  # calls that launched nothing compute nothing
    if not live:
        return []
    top = max(s[3] for s in live)
    width = 1 << max(0, math.ceil(math.log2((top + 1) / max_bins)))  # 1, 2, 4, ...
    total_wall = sum(s[0] for s in live) or 1.0
    bins: dict[int, list[StepSample]] = {}
    for s in live:
        bins.setdefault(s[3] // width, []).append(s)
    out = []
    for b in sorted(bins):
        group = bins[b]
        wall = sum(s[0] for s in group)
        rows = sum(s[1] for s in group)
        out.append({"running_lo": b * width, "running_hi": b * width + width - 1,
                    "running_max": max(s[3] for s in group),
                    "step_calls": len(group), "launches": sum(s[2] for s in group),
                    "rows": rows, "wall_s": round(wall, 6),
                    "time_share": round(wall / total_wall, 4),
                    "mean_rows_per_call": round(rows / len(group), 2),
                    "tok_per_s": round(rows / wall, 1) if wall > 0 else None})
    return out


def draw(path: Path, bins: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """One series: tok/s at each bin's mid running-request count."""
    pts = [((b["running_lo"] + b["running_hi"]) / 2, b["tok_per_s"]) for b in bins
           if b["tok_per_s"] is not None]
    return plot(path, {"tok/s": pts}, title, "running requests", "tokens/s (rows / step wall)")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n")[2].strip())
    src = Path(sys.argv[1])
    result = json.loads(src.read_text())
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_suffix(".png")
    cfg = result["config"]
    info = draw(out, result["running_histogram"],
                f"{cfg['model']} {cfg['device']} {cfg['workload']}")
    print(f"wrote {out} ({info['renderer']})")


if __name__ == "__main__":
    main()
