"""Where the tensor-core tile GEMM's time goes at mid M (cuda/linear_mma.cu, form (1, 4, 2, 2)):

1. time per launch (bench/gemm_bench.py's graph replays, the median of five) against K, M and
   N, with and without the block-ahead prefetch: the slope per 64-wide K block and what does
   not move it;
2. %globaltimer at each CTA's start and before its stores, from a copy of linear_mma.cu with
   those two reads added (the arithmetic untouched), for one launch of qkv at 256 rows and
   of down at 256 rows.

    PYTHONPATH=$PWD python3 bench/gemm_mma_probe.py [--json bench/gemm-mma-probe-h200.json]
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from common import write_json
from gemm_bench import Timer, int8_weight

from crucible.kernels import linear_mma as lm
from crucible.kernels.source import cuda_source_dir, read_cuda_source

FORM = (1, 4, 2, 2)
SWEEP = ((256, 960, 64), (256, 960, 192), (256, 960, 576), (256, 960, 1536), (32, 960, 576),
         (64, 960, 576), (128, 960, 576), (256, 576, 576), (256, 64, 576))
CLOCKED = ((256, 960, 576), (256, 576, 1536))  # qkv and down at 256 rows
KERNEL = "linear_mma<1, 4, 2, 2, false, true>"
# (anchor, text, after): a %globaltimer read at the start and one before the stores, and
# the array they go to (after the includes).
PROBES = (
    ("    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
     "    unsigned long long t_start;\n"
     "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t_start));\n", False),
    ("#pragma unroll\n    for (int i = 0; i < MT; ++i)\n#pragma unroll\n"
     "        for (int c = 0; c < NT; ++c) {\n            const int col = n0 + 8 * c + 2 * t;",
     "    {\n        unsigned long long t_end;\n"
     "        asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t_end));\n"
     "        const int cta = blockIdx.y * gridDim.x + blockIdx.x;\n"
     "        if (threadIdx.x == 0) { cru_clk[0][cta] = t_start; cru_clk[1][cta] = t_end; }\n"
     "    }\n", False),
    ('#include "pdl.cuh"\n', "__device__ unsigned long long cru_clk[2][4096];\n", True),
)


def clocked_source() -> str:
    """linear_mma.cu with the two clock reads; the arithmetic untouched."""
    src = read_cuda_source("linear_mma.cu")
    for anchor, text, after in PROBES:
        if anchor not in src:
            raise SystemExit(f"gemm_mma_probe: linear_mma.cu changed, anchor not found: {anchor!r}")
        src = src.replace(anchor, anchor + text if after else text + anchor, 1)
    return src


def sweep(cp: Any, rng: np.random.Generator, stream: Any) -> list[dict[str, Any]]:
    rows = []
    for m, n, k in SWEEP:
        wd, _ = int8_weight(n, k, rng)
        x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        y = cp.empty((m, n), cp.float32)
        us = {}
        for pf in (False, True):
            t = Timer(lambda: lm.linear_mma(x, wd, y, form=FORM, prefetch=pf), 5.0, stream)
            us[pf] = sorted(t.once() * 1e3 for _ in range(5))[2]
        rows.append({"M": m, "N": n, "K": k, "us_nopf": us[False], "us_pf": us[True]})
        print(m, n, k, f"no-pf {us[False]:.2f} us  pf {us[True]:.2f} us", flush=True)
    return rows


def cta_clocks(cp: Any, rng: np.random.Generator) -> dict[str, Any]:
    mod = cp.RawModule(code=clocked_source(), options=("-std=c++17", f"-I{cuda_source_dir()}"),
                       name_expressions=[KERNEL])
    fn, clk = mod.get_function(KERNEL), mod.get_global("cru_clk")
    out = {}
    for m, n, k in CLOCKED:
        wd, _ = int8_weight(n, k, rng)
        x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        y = cp.empty((m, n), cp.float32)
        grid = (n // 64, -(-m // 32))
        args = (x, wd.w, wd.scale, np.uint64(0), y, np.int32(m), np.int32(n), np.int32(k))
        for _ in range(3):  # the last launch's clocks are read
            fn(grid, (128,), args)
        cp.cuda.Device().synchronize()
        c = cp.ndarray((2, 4096), cp.uint64, clk).get()
        ctas = grid[0] * grid[1]
        st, en = c[0, :ctas].astype(np.int64), c[1, :ctas].astype(np.int64)
        dur = en - st
        out[f"{m}x{n}x{k}"] = e = {
            "ctas": ctas, "start_spread_ns": int(st.max() - st.min()),
            "end_max_ns": int(en.max() - st.min()),
            "dur_ns": {"min": int(dur.min()), "median": int(np.median(dur)), "max": int(dur.max())}}
        print(m, n, k, e, flush=True)
    return out


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    result = {"command": "python3 bench/gemm_mma_probe.py " + " ".join(sys.argv[1:]),
              "sweep": sweep(cp, rng, stream), "ctas": cta_clocks(cp, rng)}
    if a.json:
        write_json(a.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
