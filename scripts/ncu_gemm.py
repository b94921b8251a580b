"""The default model's GEMMs at chosen M, launched through ``linear()`` (its own routing),
for Nsight Compute to profile.

    ncu --clock-control none --kernel-name regex:linear --launch-skip 5 --launch-count 5 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section MemoryWorkloadAnalysis_Tables --section InstructionStats \
        python3 scripts/ncu_gemm.py --m 1024 [--shapes qkv,o,gate_up,down]

Each shape runs ``--reps`` times at each M (int8 weights, random codes); the first round
warms up (compiles, sets shared-memory opt-ins), so skip it with ``--launch-skip``. Nothing
is measured here; ncu reports per-kernel figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gemm_bench import SHAPES, int8_weight  # noqa: E402

from crucible.kernels import linear as ck  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="1024", help="comma-separated row counts")
    p.add_argument("--shapes", default="qkv,o,gate_up,down")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    for m in (int(v) for v in args.m.split(",")):
        for name in args.shapes.split(","):
            n, k, res = SHAPES[name]
            wd, _ = int8_weight(n, k, rng)
            x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
            out = cp.empty((m, n), cp.float32)
            r = cp.asarray(rng.standard_normal((m, n)).astype(np.float32)) if res else None
            for _ in range(args.reps):
                ck.linear(x, wd, out, r)
            cp.cuda.Device().synchronize()
            print(f"{name} M={m} N={n} K={k}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
