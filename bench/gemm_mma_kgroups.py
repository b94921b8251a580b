"""The tensor-core tile GEMM (cuda/linear_mma.cu) with K groups against the same form
without, on the default model's layer shapes at mid M: same bits (checked), time per launch.

    PYTHONPATH=$PWD python3 bench/gemm_mma_kgroups.py [--m 128,256,384,512] [--rounds 7]
        [--json bench/gemm-mma-kgroups-h200.json]

For each shape and M the form is pick_form's; configurations: ``kg1`` (no K groups, the
prefetch by its PF_MAX_CTAS rule, as before K groups), ``kg2`` and ``kg2pf`` (two groups,
prefetch off and on) and ``kg3`` (three, no prefetch). Timing as bench/gemm_bench.py (a
graph of back-to-back launches, rounds in alternating order); ratios are kg1's time over
each configuration's, paired per round. ``routed``: what linear_mma's rule picks there.
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

CONFIGS = {"kg1": (1, None), "kg2": (2, False), "kg2pf": (2, True), "kg3": (3, False)}


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="128,256,384,512")
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
            if form not in lm.KG_FORMS:
                print(f"{name} M={m}: form {form} has no K groups, skipped", flush=True)
                continue
            x = cp.asarray((rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1)))
                           .astype(np.float32))
            res = cp.asarray(rng.standard_normal((m, n)).astype(np.float32)) if with_res else None
            outs = {c: cp.empty((m, n), cp.float32) for c in CONFIGS}

            def fn(c: str) -> Any:
                kg, pf = CONFIGS[c]
                return lambda: lm.linear_mma(x, wd, outs[c], res, form=form, prefetch=pf,
                                             kgroups=kg)

            for c in CONFIGS:
                fn(c)()
            same = {c: bool(cp.array_equal(outs[c].view(cp.uint32), outs["kg1"].view(cp.uint32)))
                    for c in CONFIGS}
            bad += not all(same.values())
            timers = {c: Timer(fn(c), a.ms, stream) for c in CONFIGS}
            us: dict[str, list[float]] = {c: [] for c in CONFIGS}
            names = list(CONFIGS)
            for r in range(a.rounds):
                for c in names if r % 2 == 0 else names[::-1]:
                    us[c].append(timers[c].once() * 1e3)
            grid = (n // (8 * form[1] * form[3])) * -(-m // (16 * form[0] * form[2]))
            entry = {"shape": name, "M": m, "N": n, "K": k, "form": list(form), "ctas": grid,
                     "routed_kgroups": lm.pick_kgroups(form, grid, k), "identical": same,
                     "us": {c: stat(v) for c, v in us.items()},
                     "kg1_over": {c: stat([b / x for b, x in zip(us["kg1"], v)])
                                  for c, v in us.items()}}
            results.append(entry)
            print(f"{name:<8} M={m:<5} form {form} ctas {grid:<4} routed kg "
                  f"{entry['routed_kgroups']}  " + "  ".join(
                      f"{c} {statistics.median(us[c]):6.2f} us x{entry['kg1_over'][c]['median']:.2f}"
                      for c in CONFIGS) + ("" if all(same.values()) else "  BITS DIFFER"),
                  flush=True)
    if a.json:
        write_json(a.json, {"command": "python3 bench/gemm_mma_kgroups.py " + " ".join(sys.argv[1:]),
                            "results": results, "failures": bad})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
