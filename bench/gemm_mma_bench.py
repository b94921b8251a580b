"""The tensor-core int8 GEMM (cuda/linear_mma.cu) against what ``linear()`` runs now, on the
default model's shapes: its bits across forms and M, its error against float64 beside the
current kernels', and its speed.

    PYTHONPATH=$PWD python3 bench/gemm_mma_bench.py [--json PATH] [--rounds 5] [--ms 5]

Exactness (asserted; exit 1 on a failure): for every form that fits a shape and M in
``EXACT_MS``, rows equal the 2,048-row launch's bit for bit; rows in another order give the
same rows; huge values in the other rows change nothing; the one-accumulator control must
differ (else the check could not see an order change). Error: |y - y64| over
scale * sum |x q| (the products' magnitude), max and mean, for linear_mma and linear().
Activations: normal, each row scaled by 10^U(-2, 2). Timing as bench/gemm_bench.py (graph
of back-to-back launches, rounds in alternating order); each M times linear() and every
fitting form (the rows kernel's up to ROWS_TIMED rows); reported: the best form and its
speed-up over linear().
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from common import stat, write_json
from gemm_bench import SHAPES, int8_weight, measure, tflops

from crucible.kernels import linear as ck
from crucible.kernels import linear_mma as lm

EXACT_MS = (1, 5, 16, 33, 256, 2048)
TIME_MS = (1, 16, 64, 128, 256, 512, 1024, 2048)
ROWS_TIMED = 512  # the rows kernel is timed up to here (it re-reads W once per 16 rows)


def activations(m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1))
    return x.astype(np.float32)


def label(form: tuple[int, ...]) -> str:
    """A form's name in the JSON: rows2x8, mma1x2x1x4, row1x9 (the one-row kernel)."""
    kind = {1: "row1x", 2: "rows"}.get(len(form), "mma")
    return kind + "x".join(map(str, form))


def same(a: Any, b: Any) -> bool:
    import cupy as cp

    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def exactness(name: str, wd: Any, x: Any, res: Any, rng: np.random.Generator) -> list[str]:
    """Failures (empty: all held) of one shape's bitwise checks."""
    import cupy as cp

    m_all, (n, k) = x.shape[0], wd.shape
    ref = lm.linear_mma(x, wd, cp.empty((m_all, n), cp.float32), res, form=lm.CONTROL)
    bad = []
    for form in (f for f in lm.FORMS + lm.ROW_FORMS + lm.ROW1_FORMS if lm.fits(n, k, f)):
        for m in EXACT_MS:
            if len(form) == 2 and m > ROWS_TIMED or len(form) == 1 and m != 1:
                continue  # the rows kernel re-reads W per 16 rows: not past ROWS_TIMED
            r = None if res is None else res[:m]
            got = lm.linear_mma(x[:m], wd, cp.full((m, n), cp.nan, cp.float32), r, form=form)
            if not same(got, ref[:m]):
                bad.append(f"{name} form {form} M={m}: rows differ from the 2,048-row launch")
    perm = cp.asarray(rng.permutation(256))
    r = None if res is None else res[perm]
    got = lm.linear_mma(x[perm], wd, cp.empty((256, n), cp.float32), r)
    if not same(got, ref[perm]):
        bad.append(f"{name}: permuted rows differ")
    loud = x[:64].copy()
    loud[1:] = 1e30
    got = lm.linear_mma(loud, wd, cp.empty((64, n), cp.float32),
                        None if res is None else res[:64])
    if not same(got[0], ref[0]):
        bad.append(f"{name}: huge values in other rows changed row 0")
    for form in (lm.CONTROL, lm.ROW_CONTROL):
        ctl = lm.linear_mma(x[:256], wd, cp.empty((256, n), cp.float32),
                            None if res is None else res[:256], form=form, one_acc=True)
        if same(ctl, ref[:256]):
            bad.append(f"{name}: the one-accumulator control {form} equals the canonical order")
    return bad


def errors(y: Any, x: np.ndarray, codes: np.ndarray, scale: np.ndarray,
           res: np.ndarray | None) -> dict[str, float]:
    y64 = (x.astype(np.float64) @ codes.T.astype(np.float64)) * scale
    mag = (np.abs(x.astype(np.float64)) @ np.abs(codes.T.astype(np.float64))) * scale
    if res is not None:
        y64 = y64 + res
        mag = mag + np.abs(res)
    e = np.abs(y.get().astype(np.float64) - y64) / np.maximum(mag, 1e-300)
    return {"max": float(e.max()), "mean": float(e.mean())}


def accuracy_of(name: str, wd: Any, x: Any, xh: np.ndarray, res: Any, resh: Any,
                codes: np.ndarray, scale: np.ndarray) -> dict:
    """Both orders' error against float64 over 256 rows of the shape."""
    import cupy as cp

    n, sub = wd.shape[0], slice(0, 256)
    r, rh = (None, None) if res is None else (res[sub], resh[sub])
    e_mma = errors(lm.linear_mma(x[sub], wd, cp.empty((256, n), cp.float32), r), xh[sub], codes,
                   scale, rh)
    e_now = errors(ck.linear(x[sub], wd, cp.empty((256, n), cp.float32), r), xh[sub], codes,
                   scale, rh)
    print(f"{name:8s} error max/mean: mma {e_mma['max']:.2e}/{e_mma['mean']:.2e} "
          f"linear {e_now['max']:.2e}/{e_now['mean']:.2e}", flush=True)
    return dict(shape=name, mma=e_mma, linear=e_now)


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ms", type=float, default=5.0, help="target ms per timed replay")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--m", default=",".join(map(str, TIME_MS)))
    ap.add_argument("--timing-only", action="store_true",
                    help="skip the exactness and accuracy checks (the GPU tests' job)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    failures, accuracy, rows = [], [], []
    for name in a.shapes.split(","):
        n, k, with_res = SHAPES[name]
        wd, _ = int8_weight(n, k, rng)
        codes, scale = wd.w.get(), wd.scale.get()
        xh = activations(2048, k, rng)
        x = cp.asarray(xh)
        resh = rng.standard_normal((2048, n)).astype(np.float32) if with_res else None
        res = None if resh is None else cp.asarray(resh)
        if not a.timing_only:  # (with it the GPU tests check the bits; this run only times)
            failures += exactness(name, wd, x, res, rng)
            accuracy.append(accuracy_of(name, wd, x, xh, res, resh, codes, scale))
        for m in map(int, a.m.split(",")):
            xm, rm = x[:m], None if res is None else res[:m]
            outs = [cp.empty((m, n), cp.float32) for _ in range(2)]
            fns = {"linear": lambda: ck.linear(xm, wd, outs[0], rm)}
            forms = (lm.FORMS + (lm.ROW_FORMS if m <= ROWS_TIMED else ())
                     + (lm.ROW1_FORMS if m == 1 else ()))
            for form in (f for f in forms if lm.fits(n, k, f)):
                fns[label(form)] = (
                    lambda form=form: lm.linear_mma(xm, wd, outs[1], rm, form=form))
            ms = measure(fns, a.rounds, a.ms, stream)
            t = {key: stat(tflops(m, n, k, v)) for key, v in ms.items()}
            us = {key: stat([1e3 * v for v in vals])["median"] for key, vals in ms.items()}
            best = max((key for key in t if key != "linear"), key=lambda kk: t[kk]["median"])
            picked = lm.pick_form(m, n, k)
            pk = label(picked)
            rows.append(dict(shape=name, M=m, N=n, K=k, us=us, best=best, picked=pk,
                             speedup=us["linear"] / us[best],
                             picked_speedup=us["linear"] / us[pk], tflops=t))
            print(f"{name:8s} M={m:5d} linear {us['linear']:8.1f} us  best {best:12s} "
                  f"{us[best]:8.1f} us  {us['linear'] / us[best]:5.2f}x  picked {pk} "
                  f"{us['linear'] / us[pk]:5.2f}x", flush=True)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    result = dict(command=" ".join(["python3", *sys.argv]), device=props["name"].decode(),
                  rounds=a.rounds, target_ms=a.ms, weights="int8",
                  exactness_checked=not a.timing_only, failures=failures,
                  accuracy=accuracy, results=rows)
    if a.json:
        write_json(a.json, result)
    for f in failures:
        print("FAILED:", f)
    print("exactness: not checked (--timing-only)" if a.timing_only
          else f"exactness: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
