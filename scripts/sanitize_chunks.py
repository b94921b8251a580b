"""A few small launches of the chunk GEMM (cuda/linear_chunks.cu) for compute-sanitizer,
row blocks included: each runs once and must equal linear_tiled bit for bit.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_chunks.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_chunks.py

Cases (M, N, K): one row block with column and K tails (40, 70, 112), two blocks the last
partial (100, 96, 192), three whole blocks of the default model's O shape (192, 576, 576);
int8 and f32, store + residual and SwiGLU, 32 and 64 columns a tile. Prints one line per
case and exits 1 on any difference.
"""

from __future__ import annotations

import sys

import numpy as np

from crucible.kernels import linear as ck
from crucible.kernels import linear_chunks as cc
from crucible.kernels.device_weight import upload_weight

CASES = ((40, 70, 112), (100, 96, 192), (192, 576, 576))


def main() -> int:
    import cupy as cp

    rng = np.random.default_rng(0)
    bad = 0
    for m, n, k in CASES:
        x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        res = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
        w = rng.standard_normal((n, k)).astype(np.float32)
        for label, wd in (("f32", upload_weight(w, None)),
                          ("int8", upload_weight(np.clip(np.round(w * 40), -127, 127)
                                                 .astype(np.int8),
                                                 (0.01 + 0.01 * rng.random(n)).astype(np.float32)))):
            want = ck.linear_tiled(x, wd, cp.empty((m, n), cp.float32), res)
            f = n // 2  # SwiGLU's bits are gpu-engine-check's (chunks_check.py); here it runs
            for nt in cc.NT_CHOICES:
                got = cc.linear_chunks(x, wd, cp.empty((m, n), cp.float32), res, nt=nt)
                same = bool(cp.array_equal(got.view(cp.uint32), want.view(cp.uint32)))
                sw = cc.linear_chunks(x, wd, cp.empty((m, f), cp.float32), epi=cc.EPI_SWIGLU,
                                      nt=nt)
                ok = same and sw.shape == (m, f) and bool(cp.isfinite(sw).all())
                bad += not ok
                print(f"M={m} N={n} K={k} {label} nt={nt}: store+residual "
                      f"{'==' if same else '!='} tiled, swiglu {'ran' if ok else 'FAILED'}")
    cp.cuda.Device().synchronize()
    s = cc.current_scratch()
    zero = s is not None and not bool(s.counters.any())
    print(f"counters back to zero: {zero}; {bad} failed")
    return 1 if bad or not zero else 0


if __name__ == "__main__":
    sys.exit(main())
