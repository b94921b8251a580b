"""attn_decode's RoPE-in form against the separate launches it replaces, on the GPU.

For decode steps of each row count: the QKV GEMM (linear_mma, int8, the default model's
960 x 576) then either rope_store + the decode attention (two launches) or the RoPE-in
attention (one). Checks that both leave the same bits in the output and both pools, then
(unless --quick) times each chain as a CUDA graph with PDL: replays of one layer's chain,
the two alternating within each round, min and max over rounds.

    python3 bench/rope_in_check.py --json bench/rope-in-check.json
    compute-sanitizer --tool memcheck python3 bench/rope_in_check.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def time_graph(cp: object, fn: object, replays: int) -> float:
    """Microseconds a replay of ``fn``'s launches captured as one graph."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # warm-up: modules, shared-memory opt-ins
        stream.begin_capture()
        fn()
        graph = stream.end_capture()
        graph.launch(stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(replays):
            graph.launch(stream)
        end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1000.0 / replays


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="48,64,128,256")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="one small step, bits only (sanitizer)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import cupy as cp
    from test_gpu_rope_in import buffers, chain, fused, same, separate, step

    rows_list = [48] if args.quick else [int(r) for r in args.rows.split(",")]
    results: dict[str, dict] = {}
    for rows in rows_list:
        d = step(rows, seed=rows)
        want, got = separate(d, pdl=True), fused(d, pdl=True)
        cp.cuda.Device().synchronize()
        equal = all(same(g, w) for g, w in zip(got, want))
        print(f"rows {rows}: bits {'equal' if equal else 'DIFFER'}")
        if not equal:
            return 1
        if args.quick:
            continue
        times: dict[str, list[float]] = {"separate": [], "rope_in": []}
        for r in range(args.rounds):
            order = ("separate", "rope_in") if r % 2 == 0 else ("rope_in", "separate")
            for name in order:
                b = buffers(d)
                times[name].append(time_graph(
                    cp, lambda: chain(d, b, name == "rope_in", True), args.replays))
        ratio = [b / a for a, b in zip(times["separate"], times["rope_in"])]
        results[f"rows={rows}"] = {
            "separate_us": [min(times["separate"]), max(times["separate"])],
            "rope_in_us": [min(times["rope_in"]), max(times["rope_in"])],
            "rope_in_over_separate": [min(ratio), float(np.median(ratio)), max(ratio)]}
        print(f"rows {rows}: " + json.dumps(results[f"rows={rows}"]))
    if args.json:
        dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        Path(args.json).write_text(json.dumps({
            "bench": "rope-in", "device": dev,
            "command": "python3 bench/rope_in_check.py " + " ".join(argv or sys.argv[1:]),
            "note": "us per replay of one layer's chain as a graph with PDL: QKV GEMM + "
                    "rope_store + decode attention (separate) against QKV GEMM + the RoPE-in "
                    "attention",
            "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
