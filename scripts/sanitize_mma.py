"""A few small launches of the tensor-core GEMM (cuda/linear_mma.cu) for compute-sanitizer:
every form of both kernels, row tails, residual on and off; each must equal the first form's bits and
stay within 1e-6 of float64 (relative to the products' magnitude).

    compute-sanitizer --tool memcheck python3 scripts/sanitize_mma.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_mma.py

Cases (M, N, K): (5, 64, 64), (33, 128, 192), (70, 192, 576). Prints one line per case
and exits 1 on any difference.
"""

from __future__ import annotations

import numpy as np

from crucible.kernels import linear_mma as lm
from crucible.kernels.device_weight import upload_weight

CASES = ((5, 64, 64), (33, 128, 192), (70, 192, 576))


def main() -> int:
    import cupy as cp

    rng = np.random.default_rng(0)
    bad = 0
    for m, n, k in CASES:
        xh = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1))).astype(np.float32)
        codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
        scale = (0.01 + 0.01 * rng.random(n)).astype(np.float32)
        wd = upload_weight(codes, scale)
        x = cp.asarray(xh)
        for with_res in (False, True):
            resh = rng.standard_normal((m, n)).astype(np.float32) if with_res else None
            res = None if resh is None else cp.asarray(resh)
            y64 = (xh.astype(np.float64) @ codes.T.astype(np.float64)) * scale
            mag = (np.abs(xh.astype(np.float64)) @ np.abs(codes.T.astype(np.float64))) * scale
            if resh is not None:
                y64, mag = y64 + resh, mag + np.abs(resh)
            first = None
            for form in (f for f in lm.FORMS + lm.ROW_FORMS if lm.fits(n, k, f)):
                got = lm.linear_mma(x, wd, cp.full((m, n), cp.nan, cp.float32), res, form=form)
                first = got if first is None else first
                same = bool(cp.array_equal(got.view(cp.uint32), first.view(cp.uint32)))
                err = float((np.abs(got.get() - y64) / mag).max())
                ok = same and err < 1e-6
                bad += not ok
                print(f"M={m} N={n} K={k} residual={with_res} form={form}: "
                      f"{'==' if same else '!='} first form, error {err:.1e}"
                      f"{'' if ok else '  FAILED'}")
    cp.cuda.Device().synchronize()
    print(f"{bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
