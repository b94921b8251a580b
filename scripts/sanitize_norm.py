"""A few small launches of RMSNorm a warp a row (cuda/model_ops.cu rmsnorm_warps) for
compute-sanitizer: row counts across the 8-row block's edge (whole warps leave early),
widths across the register row's edges, plain and as a PDL launch; each must equal
rmsnorm_rows' bits.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_norm.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_norm.py

Prints one line per case and exits 1 on any difference.
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

from crucible.kernels.model_ops import WARP_ROW_MAX, rmsnorm_launch

CASES = ((1, 64), (7, 100), (9, 576), (17, 777), (3, 32 * WARP_ROW_MAX))


def main() -> int:
    failed = 0
    for t, d in CASES:
        rng = np.random.default_rng(t * 100 + d)
        x = cp.asarray(rng.standard_normal((t, d)).astype(np.float32))
        w = cp.asarray((0.5 + rng.random(d)).astype(np.float32))
        ref = cp.empty_like(x)
        rmsnorm_launch(x, w, ref, 1e-5, warps=False)
        for pdl in (False, True):
            y = cp.full_like(x, cp.nan)
            rmsnorm_launch(x, w, y, 1e-5, warps=True, pdl=pdl)
            same = bool(cp.array_equal(y.view(cp.uint32), ref.view(cp.uint32)))
            failed += not same
            print(f"T={t} D={d} pdl={pdl}: {'same bits' if same else 'DIFFERENT'}")
    cp.cuda.Device().synchronize()
    print("RESULT:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
