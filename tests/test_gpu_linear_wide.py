"""cuda/linear_wide.cu against linear_tiled on a real GPU, bit for bit (skipped without CuPy
or a device): int8 and f32 weights, with and without the residual, over M, N and K edges
(M tails, N not a multiple of 16, a tail K chunk, a single chunk), every built form, and the
routing in linear(). The negative controls show the comparison can fail: the same data in
another association (64-wide chunks cut into 32-wide ones; numpy's BLAS order) differs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.kernels import linear as ck  # noqa: E402
from crucible.kernels import linear_wide as lw  # noqa: E402
from crucible.kernels.device_weight import DeviceWeight  # noqa: E402

M_ALL = (1, 17, 64, 65, 127, 128, 500, 1024, 2049)
NK = [(n, k) for n in (576, 960, 3072, 100) for k in (576, 1536, 72, 64)]


def make(m: int, n: int, k: int, int8: bool, seed: int) -> tuple[Any, DeviceWeight, Any]:
    """x, the weight (both layouts, as upload_weight makes them) and a residual, random
    normal (every fma rounds; int8 codes span -127..127 with per-column scales)."""
    rs = cp.random.RandomState(seed)
    x = rs.standard_normal((m, k), dtype=cp.float32)
    res = rs.standard_normal((m, n), dtype=cp.float32)
    if int8:
        w = cp.clip(cp.rint(rs.standard_normal((n, k), dtype=cp.float32) * 40), -127,
                    127).astype(cp.int8)
        scale = (rs.random_sample(n, dtype=cp.float32) * 0.02 + 0.001).astype(cp.float32)
    else:
        w, scale = rs.standard_normal((n, k), dtype=cp.float32) / np.float32(k ** 0.5), None
    return x, DeviceWeight(cp.ascontiguousarray(w.T), cp.ascontiguousarray(w), scale), res


def poisoned(m: int, n: int) -> Any:
    return cp.full((m, n), cp.nan, cp.float32)  # an output the kernel skips shows as NaN


def same_bits(a: Any, b: Any) -> bool:
    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def check(x: Any, wd: DeviceWeight, res: Any, form: lw.Form | None, what: str) -> None:
    m, n = x.shape[0], wd.shape[0]
    for r in (None, res):
        new = lw.linear_wide(x, wd, poisoned(m, n), r, form=form)
        old = ck.linear_tiled(x, wd, poisoned(m, n), r)
        assert same_bits(new, old), f"{what} form={form or lw.pick_form(m, n, x.shape[1])} " \
            f"residual={r is not None}: {int((new != old).sum())} outputs differ"


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "f32"])
@pytest.mark.parametrize("n,k", NK, ids=[f"n{n}-k{k}" for n, k in NK])
def test_wide_matches_tiled_bitwise(n: int, k: int, int8: bool) -> None:
    for i, m in enumerate(M_ALL):
        x, wd, res = make(m, n, k, int8, seed=1000 * n + k + i)
        check(x, wd, res, None, f"M={m} N={n} K={k}")


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "f32"])
def test_lm_head_width(int8: bool) -> None:
    x, wd, res = make(500, 49152, 576, int8, seed=7)
    check(x, wd, res, None, "M=500 N=49152 K=576")


@pytest.mark.parametrize("form", lw.FORMS, ids=[f"{a}x{b}g{c}k{d}" for a, b, c, d in lw.FORMS])
def test_every_form_matches_tiled(form: lw.Form) -> None:
    for int8 in (True, False):
        for m, n, k in ((65, 100, 72), (130, 576, 576), (1, 3072, 64), (200, 96, 1536),
                        (129, 36, 200)):
            x, wd, res = make(m, n, k, int8, seed=m + n + k)
            check(x, wd, res, form, f"M={m} N={n} K={k} int8={int8}")


def test_linear_routes_here_with_the_same_bits() -> None:
    for m, n, k, tiled in ((1024, 576, 1536, False), (300, 960, 576, False),
                           (500, 49152, 576, True)):
        assert lw.use_wide(m, n, k)
        x, wd, res = make(m, n, k, True, seed=3)
        got = ck.linear(x, wd, poisoned(m, n), res, tiled=tiled)
        assert same_bits(got, ck.linear_tiled(x, wd, poisoned(m, n), res))


def test_close_to_float64() -> None:
    """Both kernels agreeing is only worth something if they compute the product."""
    for int8 in (True, False):
        x, wd, res = make(257, 960, 1536, int8, seed=11)
        got = cp.asnumpy(lw.linear_wide(x, wd, poisoned(257, 960), res))
        w = cp.asnumpy(wd.w).astype(np.float64)
        if int8:
            w *= cp.asnumpy(wd.scale).astype(np.float64)[:, None]
        ref = cp.asnumpy(res).astype(np.float64) + cp.asnumpy(x).astype(np.float64) @ w.T
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max() + 1e-6


def chunks_of_32(x: Any, wd: DeviceWeight) -> tuple[Any, DeviceWeight]:
    """x and W with every 32 k in a 64-wide chunk of their own (zeros after): the kernel then
    adds 32-wide partials in ascending order, the canonical order with chunk width 32."""
    m, k = x.shape
    n, blocks = wd.shape[0], -(-k // 32)
    xk, wk = cp.zeros((m, blocks * 32), cp.float32), cp.zeros((n, blocks * 32), wd.w.dtype)
    xk[:, :k], wk[:, :k] = x, wd.w
    xp, wp = cp.zeros((m, blocks, 64), cp.float32), cp.zeros((n, blocks, 64), wd.w.dtype)
    xp[:, :, :32], wp[:, :, :32] = xk.reshape(m, blocks, 32), wk.reshape(n, blocks, 32)
    xp, wp = xp.reshape(m, -1), wp.reshape(n, -1)
    return xp, DeviceWeight(cp.ascontiguousarray(wp.T), wp, wd.scale)


def test_negative_controls_differ() -> None:
    """Another association of the same sums gives other bits (close, not equal), so the
    bitwise comparisons above would catch a kernel that reordered its reduction."""
    for int8 in (True, False):
        x, wd, res = make(300, 576, 576, int8, seed=5)
        got = lw.linear_wide(x, wd, poisoned(300, 576), res)
        assert same_bits(got, ck.linear_tiled(x, wd, poisoned(300, 576), res))
        x32, wd32 = chunks_of_32(x, wd)
        c32 = lw.linear_wide(x32, wd32, poisoned(300, 576), res)
        assert not same_bits(c32, got)
        assert float(cp.abs(c32 - got).max()) < 1e-4 * float(cp.abs(got).max())
        dot = cp.asnumpy(x) @ cp.asnumpy(wd.w).astype(np.float32).T  # numpy's BLAS order
        if int8:
            dot *= cp.asnumpy(wd.scale)
        blas = cp.asarray(cp.asnumpy(res) + dot)
        assert not same_bits(blas, got)
        assert float(cp.abs(blas - got).max()) < 1e-4 * float(cp.abs(got).max())
