"""A few small launches of the tensor-core GEMM (cuda/linear_mma.cu) for compute-sanitizer:
every form of both kernels (the tile kernel's with its loads a block ahead and without, and
with the codes as bf16: DeviceWeight.wb), row tails, residual on and off, plain and as a
PDL launch on a stream of its own; each must equal the first form's bits and stay within
1e-6 of float64 (relative to the products' magnitude). Then a chain of PDL launches
through model_ops.cu (embed, RMSNorm, gate/up, SwiGLU, down + residual, gather) must equal
the plain chain, and every fused rows form (RMSNorm prologue, SwiGLU epilogue, or the
epilogue alone) the separate kernels.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_mma.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_mma.py [--one-row]

Cases (M, N, K): (1, 160, 192) (the one-row forms too: 10 warps, one CTA partly idle),
(5, 64, 64), (33, 128, 192), (70, 192, 576); chains at M = 5 and 70.
``--one-row``: only the one-row case and the fused forms at one row (linear_mma_row1.cu).
Prints one line per case and exits 1 on any difference.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from crucible.kernels import linear_mma as lm
from crucible.kernels.device_weight import upload_weight
from crucible.kernels.model_ops import flat_launch, rows_launch

CASES = ((1, 160, 192), (5, 64, 64), (33, 128, 192), (70, 192, 576))


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    one_row = "--one-row" in (sys.argv[1:] if argv is None else argv)
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    bad = 0
    for m, n, k in CASES[:1] if one_row else CASES:
        xh = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1))).astype(np.float32)
        codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
        scale = (0.01 + 0.01 * rng.random(n)).astype(np.float32)
        wd = upload_weight(codes, scale)
        wdb = upload_weight(codes, scale, bf16=True)  # the tile kernel's BW forms
        x = cp.asarray(xh)
        for with_res in (False, True):
            resh = rng.standard_normal((m, n)).astype(np.float32) if with_res else None
            res = None if resh is None else cp.asarray(resh)
            y64 = (xh.astype(np.float64) @ codes.T.astype(np.float64)) * scale
            mag = (np.abs(xh.astype(np.float64)) @ np.abs(codes.T.astype(np.float64))) * scale
            if resh is not None:
                y64, mag = y64 + resh, mag + np.abs(resh)
            first = None
            forms = [f for f in lm.FORMS + lm.ROW_FORMS + (lm.ROW1_FORMS if m == 1 else ())
                     if lm.fits(n, k, f)]
            runs = [(f, pdl, pf, w) for pdl in (False, True) for f in forms
                    for pf in ((False, True) if len(f) == 4 else (None,))
                    for w in ((wd, wdb) if len(f) == 4 else (wd,))]
            for form, pdl, pf, w in runs:  # pf: the tile kernel's loads a block ahead or not
                with stream if pdl else cp.cuda.Stream.null:
                    got = lm.linear_mma(x, w, cp.full((m, n), cp.nan, cp.float32), res,
                                        form=form, pdl=pdl, prefetch=pf,
                                        bf16=w is wdb)
                    cp.cuda.get_current_stream().synchronize()
                first = got if first is None else first
                same = bool(cp.array_equal(got.view(cp.uint32), first.view(cp.uint32)))
                err = float((np.abs(got.get() - y64) / mag).max())
                ok = same and err < 1e-6
                bad += not ok
                print(f"M={m} N={n} K={k} residual={with_res} form={form} pdl={pdl} pf={pf} "
                      f"bf16={w is wdb}: "
                      f"{'==' if same else '!='} first form, error {err:.1e}"
                      f"{'' if ok else '  FAILED'}")
    for m in () if one_row else (5, 70):
        plain = chain(m, False)
        with stream:
            got = chain(m, True)
            stream.synchronize()
        same = bool(cp.array_equal(got.view(cp.uint32), plain.view(cp.uint32)))
        bad += not same
        print(f"chain M={m}: PDL {'==' if same else '!= FAILED'} plain")
    for m in (1,) if one_row else (1, 5, 33):  # the fused forms (RMSNorm, SwiGLU)
        for norm, swiglu in ((True, False), (True, True), (False, True)):
            bad += fused_case(m, swiglu, norm)
    cp.cuda.Device().synchronize()
    print(f"{bad} failed")
    return 1 if bad else 0


def chain(m: int, pdl: bool) -> Any:
    """embed -> RMSNorm -> gate/up -> SwiGLU -> down + residual -> gather rows (reversed)."""
    import cupy as cp

    rng = np.random.default_rng(m)  # the same inputs for the plain and the PDL chain
    d, f, vocab = 64, 128, 50
    table = cp.asarray(rng.standard_normal((vocab, d)).astype(np.float32))
    ids = cp.asarray(rng.integers(0, vocab, m).astype(np.int32))
    norm = cp.asarray((0.5 + rng.random(d)).astype(np.float32))
    gu = upload_weight(rng.integers(-127, 128, (2 * f, d)).astype(np.int8),
                       (0.01 + 0.01 * rng.random(2 * f)).astype(np.float32))
    down = upload_weight(rng.integers(-127, 128, (d, f)).astype(np.int8),
                         (0.01 + 0.01 * rng.random(d)).astype(np.float32))
    rows = cp.asarray(np.arange(m)[::-1].astype(np.int32))
    x, xn, y = (cp.full((m, d), cp.nan, cp.float32) for _ in range(3))
    g, h = cp.full((m, 2 * f), cp.nan, cp.float32), cp.full((m, f), cp.nan, cp.float32)
    out = cp.full((m, d), cp.nan, cp.float32)
    rows_launch("embed_rows", m, (table, ids, x, np.int32(d)), pdl=pdl)
    rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(d), np.float32(1e-5)), pdl=pdl)
    lm.linear_mma(xn, gu, g, pdl=pdl)
    flat_launch("swiglu_rows", h.size, (g, h, np.int32(f), np.int64(h.size)), pdl=pdl)
    lm.linear_mma(h, down, y, x, pdl=pdl)
    rows_launch("gather_rows", m, (y, rows, out, np.int32(d)), pdl=pdl)
    return out


def fused_case(m: int, swiglu: bool, with_norm: bool = True) -> int:
    """Every fused rows form (at one row the one-row forms too) == rmsnorm_rows (where
    ``with_norm``), linear_mma (and swiglu_rows); failures."""
    import cupy as cp

    rng = np.random.default_rng(m + swiglu)
    n, k = 256, 192
    x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    norm = cp.asarray((0.5 + rng.random(k)).astype(np.float32))
    wd = upload_weight(rng.integers(-127, 128, (n, k)).astype(np.int8),
                       (0.01 + 0.01 * rng.random(n)).astype(np.float32))
    xn, y = cp.empty_like(x), cp.empty((m, n), cp.float32)
    if with_norm:
        rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(k), np.float32(1e-5)))
    else:
        xn = x
        norm = None
    ref = lm.linear_mma(xn, wd, y)
    if swiglu:
        ref = cp.empty((m, n // 2), cp.float32)
        flat_launch("swiglu_rows", ref.size, (y, ref, np.int32(n // 2), np.int64(ref.size)))
    bad = 0
    one_row = lm.ROW1_FORMS if m == 1 and not swiglu else ()
    for form in (f for f in lm.ROW_FORMS + one_row if (not swiglu or f[0] % 2 == 0)
                 and lm.fits(n, k, f, with_norm, m)):
        out = cp.full(ref.shape, cp.nan, cp.float32)
        got = lm.linear_mma(x, wd, out, form=form, norm=norm, eps=1e-5, swiglu=swiglu)
        ok = bool(cp.array_equal(got.view(cp.uint32), ref.view(cp.uint32)))
        bad += not ok
        print(f"fused M={m} norm={with_norm} swiglu={swiglu} form={form}: "
              f"{'==' if ok else '!= FAILED'} separate")
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
