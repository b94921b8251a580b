"""The tensor-core GEMM with x split once per CTA (cuda/linear_mma_smem.cu) against the form
linear_mma routes today, on the default model's shapes: bits and speed, one process.

    PYTHONPATH=$PWD python3 bench/gemm_mma_smem.py [--m 128,256,512,1024,2048] [--rounds 7]
        [--json PATH]

Per shape and M: the routed form (pick_form, with the codes as bf16 where bw_wanted says;
rows forms where it picks them) and every linear_mma_smem form that fits, each output
compared bit for bit with the routed one (exit 1 on a difference), and us per launch (a
graph of back-to-back launches, rounds in alternating order, median and min-max), with the
routed time over each form's paired per round (above 1: the smem form is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from common import stat, write_json
from gemm_bench import SHAPES, int8_weight, measure

from crucible.kernels import linear_mma as lm
from crucible.kernels import linear_mma_smem as ls
from crucible.kernels.device_weight import upload_weight

TIME_MS = (128, 256, 512, 1024, 2048)


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ms", type=float, default=5.0, help="target ms per timed replay")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--m", default=",".join(map(str, TIME_MS)))
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    rows, failures = [], []
    for name in a.shapes.split(","):
        n, k, with_res = SHAPES[name]
        wd0, _ = int8_weight(n, k, rng)
        wd = upload_weight(wd0.w.get(), wd0.scale.get(), bf16=True)
        x = cp.asarray(rng.standard_normal((max(map(int, a.m.split(","))), k))
                       * 10.0 ** rng.uniform(-2, 2, (1, 1)), cp.float32)
        res = cp.asarray(rng.standard_normal((x.shape[0], n)), cp.float32) if with_res else None
        for m in map(int, a.m.split(",")):
            xm, rm = x[:m], None if res is None else res[:m]
            routed = lm.pick_form(m, n, k)
            forms = [f for f in ls.FORMS if ls.fits(n, k, f)]
            outs = {"routed": cp.full((m, n), cp.nan, cp.float32)}
            fns = {"routed": lambda: lm.linear_mma(xm, wd, outs["routed"], rm, form=routed)}
            for f in forms:
                key = f"smem {f[0]}x{f[1]}{' db' if f[2] else ''}"
                outs[key] = cp.full((m, n), cp.nan, cp.float32)
                fns[key] = (lambda f=f, o=outs[key]:
                            ls.linear_mma_smem(xm, wd, o, rm, form=f))
            ms = measure(fns, a.rounds, a.ms, stream)
            ref = outs["routed"].view(cp.uint32)
            row = dict(shape=name, M=m, N=n, K=k, routed=list(routed), same_bits={},
                       us={v: stat([1e3 * t for t in vals]) for v, vals in ms.items()},
                       routed_over={})
            line = [f"{name:8s} M={m:5d} routed {routed}: "
                    f"{1e3 * statistics.median(ms['routed']):7.1f} us"]
            for key in fns:
                if key == "routed":
                    continue
                same = bool(cp.array_equal(outs[key].view(cp.uint32), ref))
                row["same_bits"][key] = same
                if not same:
                    failures.append(f"{name} M={m} {key}: bits differ from the routed form")
                ratio = [r / t for r, t in zip(ms["routed"], ms[key])]
                row["routed_over"][key] = stat(ratio)
                line.append(f"{key} {1e3 * statistics.median(ms[key]):7.1f} us "
                            f"{statistics.median(ratio):.2f}x{'' if same else ' DIFFER'}")
            rows.append(row)
            print(" | ".join(line), flush=True)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    result = dict(command=" ".join(["python3", *sys.argv]), device=props["name"].decode(),
                  rounds=a.rounds, target_ms=a.ms, failures=failures, results=rows)
    if a.json:
        write_json(a.json, result)
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
