"""The tensor-core tile GEMM through linear_mma_pipe.cu's cp.async pipeline (stages S, K
groups KG) against linear_mma.cu's own kernel for the same form, on the default model's
layer shapes: same bits (checked), time per launch.

    PYTHONPATH=$PWD python3 bench/gemm_mma_pipe.py [--m 128,256,512,1024] [--rounds 7]
        [--json bench/gemm-mma-pipe-h200.json]

For each shape and M the form is pick_form's (tile forms only); ``tile`` is linear_mma.cu
(its prefetch by the PF_MAX_CTAS rule), ``sS-kgG`` each built pipelined form of that form.
Timing as bench/gemm_bench.py (a graph of back-to-back launches, rounds in alternating
order); ratios are the tile kernel's time over each configuration's, paired per round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import numpy as np

from common import stat, write_json
from gemm_bench import SHAPES, Timer, int8_weight

from crucible.kernels import linear_mma as lm
from crucible.kernels import linear_mma_pipe as lp


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="128,256,512,1024")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ms", type=float, default=5.0, help="target ms per timed replay")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    results: list[dict[str, Any]] = []
    bad = 0
    for name in a.shapes.split(","):
        n, k, with_res = SHAPES[name]
        wd, _ = int8_weight(n, k, rng)
        for m in map(int, a.m.split(",")):
            form = lm.pick_form(m, n, k)
            pipes = [p[4:] for p in lp.PIPE_FORMS if p[:4] == form]
            if len(form) != 4 or not pipes:
                print(f"{name} M={m}: form {form} has no pipelined form, skipped", flush=True)
                continue
            x = cp.asarray((rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1)))
                           .astype(np.float32))
            res = cp.asarray(rng.standard_normal((m, n)).astype(np.float32)) if with_res else None
            configs: dict[str, tuple[int, int]] = {"tile": (0, 0)}
            configs.update({f"s{s}-kg{g}": (s, g) for s, g in pipes})
            outs = {c: cp.empty((m, n), cp.float32) for c in configs}

            def fn(c: str) -> Any:
                return lambda: lm.linear_mma(x, wd, outs[c], res, form=form, pipe=configs[c])

            for c in configs:
                fn(c)()
            same = {c: bool(cp.array_equal(outs[c].view(cp.uint32), outs["tile"].view(cp.uint32)))
                    for c in configs}
            bad += not all(same.values())
            timers = {c: Timer(fn(c), a.ms, stream) for c in configs}
            us: dict[str, list[float]] = {c: [] for c in configs}
            names = list(configs)
            for r in range(a.rounds):
                for c in names if r % 2 == 0 else names[::-1]:
                    us[c].append(timers[c].once() * 1e3)
            entry = {"shape": name, "M": m, "N": n, "K": k, "form": list(form), "identical": same,
                     "us": {c: stat(v) for c, v in us.items()},
                     "tile_over": {c: stat([b / x for b, x in zip(us["tile"], v)])
                                   for c, v in us.items()},
                     "tflops": {c: 2.0 * m * n * k / (statistics.median(v) * 1e-6) / 1e12
                                for c, v in us.items()}}
            results.append(entry)
            print(f"{name:<8} M={m:<5} form {form}  " + "  ".join(
                f"{c} {statistics.median(us[c]):6.2f} us x{entry['tile_over'][c]['median']:.2f}"
                for c in configs) + ("" if all(same.values()) else "  BITS DIFFER"), flush=True)
    if a.json:
        write_json(a.json, {"command": "python3 bench/gemm_mma_pipe.py " + " ".join(sys.argv[1:]),
                            "results": results, "failures": bad})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
