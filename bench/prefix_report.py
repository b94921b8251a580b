"""The prefix cache bench's results (bench/prefix_cache_bench.py): runs compared token
for token, figures summarised per config, ratios paired within a round, the table.
"""

from __future__ import annotations

from typing import Any

from common import stat


def first_mismatch(ref: list[list[int]], got: list[list[int]]) -> dict[str, Any] | None:
    bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
    if len(ref) != len(got):
        return {"differing": None, "lengths": [len(ref), len(got)]}
    if not bad:
        return None
    i = bad[0]
    a, b = ref[i], got[i]
    pos = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"differing": len(bad), "first_index": i, "first_position": pos}


def summarize(runs: list[dict[str, Any]], keys: tuple[str, ...],
              configs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in configs:
        mine = [r["figures"] for r in runs if r["config"] == name]
        if mine:
            out[name] = {k: stat([m[k] for m in mine]) for k in keys}
    return out


def paired(runs: list[dict[str, Any]], key: str, num: str, den: str) -> dict[str, Any]:
    rounds = sorted({r["round"] for r in runs})
    by = {(r["round"], r["config"]): r["figures"][key] for r in runs}
    per = [round(by[(i, num)] / by[(i, den)], 4) for i in rounds]
    return {"per_round": per, **{k: round(v, 4) for k, v in stat(per).items()}}


def table(result: dict[str, Any]) -> None:
    c = result["config"]
    print(f"\n{c['model']} on {c['device']}, {c['rounds']} round(s); median [min-max]")
    for w, s in result["summary"].items():
        for k in s["on"]:
            on, off = s["on"][k], s["off"][k]
            print(f"{w + ' ' + k:24s} on {on['median']:10.4g} [{on['min']:.4g}-{on['max']:.4g}]"
                  f"{'':>4s}off {off['median']:10.4g} [{off['min']:.4g}-{off['max']:.4g}]")
    for k, v in result["ratios"].items():
        target = (f"  target >= {v['target']}: {'met' if v['median_meets_target'] else 'NOT met'}"
                  if "target" in v else "")
        print(f"{k:28s} {v['median']:.3f} [{v['min']:.3f}-{v['max']:.3f}]{target}")
    for w, ok in result["exact"].items():
        print(f"{w} tokens identical across every run: {ok}"
              + ("" if ok else f"  {result['mismatches'][w]}"))
