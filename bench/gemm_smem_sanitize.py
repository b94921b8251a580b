"""A few small launches of the split-once tensor-core GEMM (cuda/linear_mma_smem.cu), every
form, for compute-sanitizer: each runs once and is compared bit for bit with linear_mma.

    compute-sanitizer --tool memcheck python3 bench/gemm_smem_sanitize.py
    compute-sanitizer --tool racecheck python3 bench/gemm_smem_sanitize.py

Cases: M=40 N=128 K=192 (a partial row tile, three K blocks, so both code stages are
reused) and M=130 N=576 K=576 (an M tail past a whole tile), with the residual.
Exit 1 on a difference.
"""

from __future__ import annotations

import sys

import numpy as np

from crucible.kernels import linear_mma as lm
from crucible.kernels import linear_mma_smem as ls
from crucible.kernels.device_weight import upload_weight

CASES = ((40, 128, 192), (130, 576, 576))


def main() -> int:
    import cupy as cp

    rng = np.random.default_rng(0)
    bad = 0
    for m, n, k in CASES:
        codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
        wd = upload_weight(codes, (0.001 + 0.02 * rng.random(n)).astype(np.float32), bf16=True)
        x = cp.asarray(rng.standard_normal((m, k)), cp.float32)
        res = cp.asarray(rng.standard_normal((m, n)), cp.float32)
        ref = lm.linear_mma(x, wd, cp.empty((m, n), cp.float32), res, form=(1, 2, 2, 2))
        for form in ls.FORMS:
            if not ls.fits(n, k, form):
                continue
            got = ls.linear_mma_smem(x, wd, cp.full((m, n), cp.nan, cp.float32), res, form=form)
            same = bool(cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32)))
            bad += not same
            print(f"M={m} N={n} K={k} form {form}: {'same' if same else 'DIFFER'}", flush=True)
    cp.cuda.runtime.deviceSynchronize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
