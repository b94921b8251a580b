"""A few small launches of the wide GEMM (cuda/linear_wide.cu), every built form, for
compute-sanitizer: each is run once and compared bit for bit with linear_tiled.

    compute-sanitizer --tool memcheck python3 bench/gemm_sanitize.py
    compute-sanitizer --tool racecheck python3 bench/gemm_sanitize.py

Cases: M=65 N=100 K=72 (row, column and K-chunk tails; int8 rows not 16-byte multiples, so
element loads) and M=130 N=576 K=576 (whole chunks, an M tail), int8 and f32, with the
residual. ``--forms picked`` runs only the form linear_wide picks, or a list of forms
(racecheck is slow: a few forms covering G = 1, 3 and 4 and both stage widths).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from crucible.kernels import linear as ck
from crucible.kernels import linear_wide as lw
from crucible.kernels.device_weight import upload_weight

CASES = ((65, 100, 72), (130, 576, 576))


def parse_form(text: str) -> lw.Form:
    """'64x64g1k16' -> (64, 64, 1, 16)."""
    bm, rest = text.split("x")
    bn, rest = rest.split("g")
    g, wk = rest.split("k")
    return (int(bm), int(bn), int(g), int(wk))


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", default="all",
                    help="all, picked, or a comma list such as 64x64g1k16,32x64g3k32")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    bad = runs = 0
    for m, n, k in CASES:
        x = cp.asarray(rng.standard_normal((m, k)), dtype=cp.float32)
        res = cp.asarray(rng.standard_normal((m, n)), dtype=cp.float32)
        codes = np.clip(np.rint(rng.standard_normal((n, k)) * 40), -127, 127).astype(np.int8)
        weights = {"int8": upload_weight(codes, (rng.random(n) * 0.02 + 0.001)),
                   "f32": upload_weight(rng.standard_normal((n, k)).astype(np.float32))}
        forms = lw.FORMS if a.forms == "all" else (lw.pick_form(m, n, k),) \
            if a.forms == "picked" else tuple(parse_form(f) for f in a.forms.split(","))
        for wname, wd in weights.items():
            ref = ck.linear_tiled(x, wd, cp.full((m, n), cp.nan, cp.float32), res)
            for form in forms:
                got = lw.linear_wide(x, wd, cp.full((m, n), cp.nan, cp.float32), res, form=form)
                same = bool(cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32)))
                runs += 1
                bad += not same
                if not same:
                    print(f"DIFFERS: M={m} N={n} K={k} {wname} form={form}")
    cp.cuda.runtime.deviceSynchronize()
    print(f"gemm_sanitize: {runs} launches, {bad} differ from linear_tiled")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
