"""``llm-engine gpu-prefill-attention-bench``: graph-replayed timing of attention variants.

For each geometry (12/3 fixture, 9/3 default model) and each of the 25 shapes, synthetic
f32 data sits in layer 1 of a 3-layer pool. Every variant (the reference always included)
is captured once as a CUDA graph of ``--iters`` launches; each trial warms, then times one
replay with CUDA events; variant order alternates between trials, and the reference /
variant ratio is taken per trial (paired) before the median. When torch imports, its f32
``scaled_dot_product_attention`` on the same shapes (contiguous K/V expanded to all heads,
outside the timing) is a peer column. Usage: ``[--variants ...] [--iters 50] [--trials 5]
[--seed S] [--json PATH] [--geometries 12/3 9/3] [--shapes NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable

from crucible.checks.attention_cases import Case, build
from crucible.checks.attention_check import to_device
from crucible.checks.attention_sdpa import sdpa_microseconds
from crucible.checks.attention_suite import bench_shapes
from crucible.kernels.variants import Variant, parse_variant
from crucible.arg_types import positive_int

HEADLINE = "exact-q4-k64"
STRONG_SHAPES = ("single-1024", "2x512", "scheduled-4x512-second")


def _capture(variant: Variant, d: dict[str, Any], iters: int, stream: Any) -> Any:
    import cupy as cp  # noqa: PLC0415

    from crucible.kernels.attention import paged_attention  # noqa: PLC0415
    from crucible.checks.attention_cases import LAYER  # noqa: PLC0415

    b = d["host"]
    out = cp.empty_like(d["q"])
    d.setdefault("outs", []).append(out)  # keep the graph's output buffer alive

    def launch() -> None:
        paged_attention(d["q"], d["k"], d["v"], LAYER, d["segs"], d["tables"], out,
                        n_heads=b.case.n_heads, n_kv_heads=b.case.n_kv_heads,
                        max_chunk=b.max_chunk, score_capacity=b.capacity, variant=variant)

    return capture_repeated(launch, iters, stream)


def capture_repeated(launch: Callable[[], Any], iters: int, stream: Any) -> Any:
    """A CUDA graph of ``iters`` back-to-back calls of ``launch`` on ``stream``. One call runs
    first, outside the capture: it compiles, sets shared-memory attributes, warms caches."""
    with stream:
        launch()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(iters):
            launch()
        graph = stream.end_capture()
    graph.upload(stream)
    return graph


def replay_us(graph: Any, iters: int, stream: Any) -> float:
    """Microseconds per call of a ``capture_repeated`` graph: one warm-up replay, one timed."""
    import cupy as cp  # noqa: PLC0415

    graph.launch(stream)  # warm-up replay
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1000.0 / iters


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def bench_shape(name: str, slices: tuple[tuple[int, int], ...], geometry: tuple[int, int],
                variants: list[Variant], iters: int, trials: int, seed: int,
                with_sdpa: bool) -> dict[str, Any]:
    import cupy as cp  # noqa: PLC0415

    host = build(Case(name, geometry[0], geometry[1], slices, seed=seed))
    d = to_device(host)
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = {v.name: _capture(v, d, iters, stream) for v in variants}
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for trial in range(trials):
        order = variants if trial % 2 == 0 else variants[::-1]
        for v in order:
            times[v.name].append(replay_us(graphs[v.name], iters, stream))
    ref = times["reference"]
    result: dict[str, Any] = {
        "rows": int(sum(n for _, n in slices)),
        "causal_positions": int(sum(n * s + n * (n + 1) // 2 for s, n in slices)),
        "us": {k: _summary(v) for k, v in times.items()},
        "ratio_vs_reference": {k: _summary([r / x for r, x in zip(ref, v)])
                               for k, v in times.items() if k != "reference"},
    }
    if with_sdpa:
        result["sdpa_f32_us"] = sdpa_microseconds(host, iters, trials)
    return result


def _target_line(name: str, entry: dict[str, Any]) -> str:
    ratio = entry["ratio_vs_reference"].get(HEADLINE)
    if ratio is None or entry["rows"] < 256:
        return ""
    need = 2.0 if name in STRONG_SHAPES else 1.5
    return f"{'met' if ratio['median'] >= need else 'MISSED'} (>= {need})"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-prefill-attention-bench")
    p.add_argument("--variants", nargs="+", default=[HEADLINE])
    p.add_argument("--iters", type=positive_int, default=50)
    p.add_argument("--trials", type=positive_int, default=5)
    p.add_argument("--seed", type=int, default=20260908)
    p.add_argument("--json", type=str, default=None)
    p.add_argument("--geometries", nargs="+", default=["12/3", "9/3"])
    p.add_argument("--shapes", nargs="+", default=None)
    p.add_argument("--no-sdpa", action="store_true")
    args = p.parse_args(argv)
    try:
        import cupy as cp  # noqa: PLC0415
    except ImportError:
        print("gpu-prefill-attention-bench needs CuPy and a CUDA GPU", file=sys.stderr)
        return 2

    variants = [Variant("reference")] + [v for v in map(parse_variant, args.variants)
                                         if v.family != "reference"]
    shapes = bench_shapes()
    names = args.shapes or list(shapes)
    report: dict[str, Any] = {
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "iters": args.iters, "trials": args.trials, "seed": args.seed,
        "variants": [v.name for v in variants], "geometries": {}}
    for geo in args.geometries:
        nh, nkv = (int(x) for x in geo.split("/"))
        table = {}
        print(f"\n== {nh} query heads / {nkv} KV heads / head_dim 64: graph replay us per "
              f"kernel, median [min-max] of {args.trials} trials x {args.iters} launches")
        for name in names:
            entry = bench_shape(name, shapes[name], (nh, nkv), variants, args.iters,
                                args.trials, args.seed, not args.no_sdpa)
            table[name] = entry
            line = f"{name:<24} rows {entry['rows']:>5}  ref {entry['us']['reference']['median']:>9.2f}"
            for v in variants[1:]:
                u, r = entry["us"][v.name], entry["ratio_vs_reference"][v.name]
                line += (f"  {v.name} {u['median']:>9.2f} ratio {r['median']:.2f} "
                         f"[{r['min']:.2f}-{r['max']:.2f}]")
            sdpa = entry.get("sdpa_f32_us")
            if sdpa:
                line += f"  sdpa {sdpa['median']:>8.2f}"
            print(line + "  " + _target_line(name, entry), flush=True)
        report["geometries"][geo] = table
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
