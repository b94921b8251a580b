"""Where the tensor-core tile GEMM's time goes at mid M (cuda/linear_mma.cu, form (1, 4, 2, 2)):

1. time per launch (bench/gemm_bench.py's graph replays, the median of five) against K, M and
   N, with and without the block-ahead prefetch: the slope per 64-wide K block and what does
   not move it;
2. %globaltimer at each CTA's start and before its stores, from a copy of linear_mma.cu with
   those two reads added (the arithmetic untouched), for one launch of qkv at 256 rows and
   of down at 256 rows.

    PYTHONPATH=$PWD OUT=bench python3 bench/gemm_mma_probe.py   (writes $OUT/gemm-probe.json)
"""
import json
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_bench import Timer  # noqa: E402
from crucible.kernels import linear_mma as lm  # noqa: E402
from crucible.kernels.device_weight import upload_weight  # noqa: E402
from crucible.kernels.source import cuda_source_dir, read_cuda_source  # noqa: E402
rng = np.random.default_rng(0)
stream = cp.cuda.Stream(non_blocking=True)
out = {"sweep": [], "ctas": {}}


def weight(n, k):
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    return upload_weight(codes, (0.001 + 0.02 * rng.random(n)).astype(np.float32))


for (m, n, k) in [(256, 960, 64), (256, 960, 192), (256, 960, 576), (256, 960, 1536),
                  (32, 960, 576), (64, 960, 576), (128, 960, 576), (256, 576, 576), (256, 64, 576)]:
    wd = weight(n, k)
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    y = cp.empty((m, n), cp.float32)
    form = (1, 4, 2, 2)
    res = {}
    for pf in (False, True):
        t = Timer(lambda: lm.linear_mma(x, wd, y, form=form, prefetch=pf), 5.0, stream)
        res[pf] = sorted(t.once() * 1e3 for _ in range(5))[2]
    out["sweep"].append({"M": m, "N": n, "K": k, "us_nopf": res[False], "us_pf": res[True]})
    print(m, n, k, "no-pf %.2f us  pf %.2f us" % (res[False], res[True]), flush=True)
# per-CTA clocks
src = read_cuda_source("linear_mma.cu")
src = src.replace("    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
    "    unsigned long long t_start; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t_start));\n    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;", 1)
src = src.replace("#pragma unroll\n    for (int i = 0; i < MT; ++i)\n#pragma unroll\n        for (int c = 0; c < NT; ++c) {\n            const int col = n0 + 8 * c + 2 * t;",
    "    { unsigned long long t_end; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t_end));\n      const int cta = blockIdx.y * gridDim.x + blockIdx.x;\n      if (threadIdx.x == 0) { cru_clk[0][cta] = t_start; cru_clk[1][cta] = t_end; } }\n#pragma unroll\n    for (int i = 0; i < MT; ++i)\n#pragma unroll\n        for (int c = 0; c < NT; ++c) {\n            const int col = n0 + 8 * c + 2 * t;", 1)
src = src.replace('#include "pdl.cuh"\n', '#include "pdl.cuh"\n__device__ unsigned long long cru_clk[2][4096];\n', 1)
assert "cru_clk[0][cta]" in src
name = "linear_mma<1, 4, 2, 2, false, true>"
mod = cp.RawModule(code=src, options=("-std=c++17", f"-I{cuda_source_dir()}"), name_expressions=[name])
fn = mod.get_function(name)
clk = mod.get_global("cru_clk")
for (m, n, k) in [(256, 960, 576), (256, 576, 1536)]:
    wd = weight(n, k)
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    y = cp.empty((m, n), cp.float32)
    grid = (n // 64, -(-m // 32))
    args = (x, wd.w, wd.scale, np.uint64(0), y, np.int32(m), np.int32(n), np.int32(k))
    for rep in range(3):
        fn(grid, (128,), args)
    cp.cuda.Device().synchronize()
    c = cp.ndarray((2, 4096), cp.uint64, clk).get()
    nct = grid[0] * grid[1]
    st, en = c[0, :nct].astype(np.int64), c[1, :nct].astype(np.int64)
    t0 = st.min()
    dur = en - st
    out["ctas"][f"{m}x{n}x{k}"] = {"ctas": nct, "start_spread_ns": int(st.max() - t0), "end_max_ns": int(en.max() - t0),
        "dur_ns": {"min": int(dur.min()), "median": int(np.median(dur)), "max": int(dur.max())}}
    print(m, n, k, out["ctas"][f"{m}x{n}x{k}"], flush=True)
json.dump(out, open(os.environ.get("OUT", ".") + "/gemm-probe.json", "w"), indent=1)
