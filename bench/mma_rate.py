"""mma.sync.m16n8k16 bf16 -> f32 throughput on this GPU, by warps an SM (one CTA an SM) and
independent accumulators a warp: the tensor pipe's rate as the mma GEMMs see it.

    python3 bench/mma_rate.py [--json bench/mma-rate-h200.json]

Reported: TFLOP/s (2 x 16 x 8 x 16 a mma) and cycles per mma per SM sub-partition at the
H200's 1.98 GHz boost clock. Configurations that do not launch (registers) are skipped.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from common import write_json

SRC = r'''
template <int A>
__global__ void rate(float* out, int iters) {
    float acc[A][4];
    for (int a = 0; a < A; ++a) for (int e = 0; e < 4; ++e) acc[a][e] = 0.f;
    unsigned ar[4] = {0x3f803f80u ^ threadIdx.x, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
    unsigned br[2] = {0x3f803f80u, 0x3f803f80u ^ threadIdx.x};
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int a = 0; a < A; ++a)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(acc[a][0]), "+f"(acc[a][1]), "+f"(acc[a][2]), "+f"(acc[a][3])
                : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
    }
    float s = 0.f;
    for (int a = 0; a < A; ++a) s += acc[a][0] + acc[a][1] + acc[a][2] + acc[a][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
'''
A_LIST = (1, 4, 12, 24)  # independent accumulators a warp
WARPS = (4, 8, 16, 32)  # warps an SM (one CTA an SM)
CLOCK_HZ = 1.98e9  # the H200's boost clock, for cycles per mma


def measure(cp: Any, fn: Any, sms: int, warps: int, a: int) -> dict[str, Any] | None:
    iters = 4096 // a
    out = cp.empty(sms * warps * 32, cp.float32)
    args = (out, np.int32(iters))
    try:
        fn((sms,), (32 * warps,), args)  # warm-up; fails where the registers do not fit
    except cp.cuda.driver.CUDADriverError as err:
        print(f"A={a} warps/SM={warps}: {err}", flush=True)
        return None
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn((sms,), (32 * warps,), args)
    end.record()
    end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end)
    tflops = sms * warps * iters * a * 2 * 16 * 8 * 16 / (ms * 1e-3) / 1e12
    cycles = ms * 1e-3 * CLOCK_HZ / (warps * iters * a / 4)  # an SM's 4 sub-partitions
    print(f"A={a:<3} warps/SM={warps:<3} {tflops:7.1f} TFLOP/s  {cycles:6.1f} cycles/mma/SP",
          flush=True)
    return {"acc_per_warp": a, "warps_per_sm": warps, "ms": ms, "tflops_bf16": tflops,
            "cycles_per_mma_per_sp_at_1.98GHz": cycles}


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    mod = cp.RawModule(code=SRC, options=("-std=c++17",),
                       name_expressions=[f"rate<{a}>" for a in A_LIST])
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    rows = [r for a in A_LIST for w in WARPS
            if (r := measure(cp, mod.get_function(f"rate<{a}>"), sms, w, a)) is not None]
    if args.json:
        write_json(args.json, {"command": "python3 bench/mma_rate.py " + " ".join(sys.argv[1:]),
                               "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
