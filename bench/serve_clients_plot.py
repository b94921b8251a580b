"""The plot of bench/serve_clients.py: output tok/s and inter-token gap p50 against clients.

    python3 bench/serve_clients_plot.py bench/serve-clients-h200.json [out.png]

Two panels, one line per (mix, engine mode), clients on a log axis. The issue's
targets are drawn as dashed lines: 30,000 tok/s and a 10 ms gap p50 at 256 clients.
serve_clients.py draws it at the end of a run. Where matplotlib is missing (the GPU
machine, CI), serve_plot.py's stdlib rasterizer draws each panel as a PNG of its own
(``<name>-tok_per_s.png``, ``<name>-gap_p50_ms.png``): linear axes, series numbered in
the JSON's ``series_colour_order``, no target lines. This script redraws from the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_report import GAP_P50_AT_256_MS, TOK_AT_256  # noqa: E402


def series(result: dict[str, Any], key: str) -> dict[str, list[tuple[int, float]]]:
    """(clients, value) per 'mix/engine mode', in client order, skipping missing values."""
    out: dict[str, list[tuple[int, float]]] = {}
    for lv in sorted(result["levels"], key=lambda lv: lv["clients"]):
        if lv.get(key) is not None:
            out.setdefault(f"{lv['mix']}/{lv['engine_mode']}", []).append(
                (lv["clients"], lv[key]))
    return out


def draw(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    panels = ((axes[0], "tok_per_s", "output tok/s (timed window)", TOK_AT_256),
              (axes[1], "gap_p50_ms", "inter-token gap p50 (ms)", GAP_P50_AT_256_MS))
    for ax, key, label, target in panels:
        for name, pts in series(result, key).items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"target at 256 clients ({target:g})")
        ax.set_xscale("log", base=2)
        ticks = sorted({lv["clients"] for lv in result["levels"]})
        ax.set_xticks(ticks, [str(t) for t in ticks])  # the levels run, not powers of 2
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{Path(cfg['model']).name} on {cfg['device']}: "
                 f"{cfg['seconds']:g} s per level, {cfg['rounds']} round(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"file": path.name, "renderer": "matplotlib"}


def draw_stdlib(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Without matplotlib: one stdlib PNG per panel beside ``path``."""
    from serve_plot import plot

    panels = {}
    for key, label in (("tok_per_s", "output tok/s"), ("gap_p50_ms", "gap p50 ms")):
        out = path.with_name(f"{path.stem}-{key}.png")
        panels[key] = plot(out, series(result, key), f"{label} against clients",
                           "concurrent streaming clients", label)
    return {"renderer": "stdlib", "panels": panels}


def try_draw(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Draw, or say why not: a plot never fails the bench."""
    try:
        try:
            return draw(path, result)
        except ImportError:
            return draw_stdlib(path, result)
    except Exception as exc:  # noqa: BLE001 - the figures matter more than the picture
        print(f"plot skipped: {exc}", flush=True)
        return {"skipped": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n")[2].strip())
    src = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_suffix(".png")
    info = try_draw(out, json.loads(src.read_text()))
    print(f"plot: {json.dumps(info)}")


if __name__ == "__main__":
    main()
