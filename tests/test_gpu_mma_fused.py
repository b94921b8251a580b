"""The fused forms of cuda/linear_mma_rows.cu on a real GPU (skipped without CuPy or a
device): the RMSNorm prologue gives rmsnorm_rows then linear_mma bit for bit, with and
without the residual, and with the SwiGLU epilogue too, swiglu_rows after them; the SwiGLU
epilogue alone gives linear_mma then swiglu_rows; at every rows form that fits (the
prologue's staged rows take shared memory: fewer forms fit as M grows), at M across the
16-row tile's edges, on the model's shapes. Negative controls: another eps, a norm weight
off by one ulp in one element, and a scale off by one ulp must change bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.kernels import linear_mma as lm  # noqa: E402
from crucible.kernels.device_weight import upload_weight  # noqa: E402
from crucible.kernels.model_ops import flat_launch, rows_launch  # noqa: E402

NK = ((960, 576), (3072, 576), (576, 1536), (128, 192))
MS = (1, 2, 15, 16, 17, 33, 64, 128)
EPS = 1e-5


def same(a: Any, b: Any) -> bool:
    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def case(n: int, k: int, seed: int) -> tuple[Any, Any, Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((128, k)) * 10.0 ** rng.uniform(-2, 2, (128, 1))
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    wd = upload_weight(codes, (0.001 + 0.02 * rng.random(n)).astype(np.float32))
    norm = cp.asarray((0.5 + rng.random(k)).astype(np.float32))
    res = cp.asarray(rng.standard_normal((128, n)).astype(np.float32))
    return cp.asarray(x.astype(np.float32)), wd, norm, res


def unfused(x: Any, wd: Any, norm: Any, res: Any, swiglu: bool, eps: float = EPS) -> Any:
    m, k = x.shape
    xn = x
    if norm is not None:
        xn = cp.empty_like(x)
        rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(k), np.float32(eps)))
    y = lm.linear_mma(xn, wd, cp.empty((m, wd.shape[0]), cp.float32), res)
    if not swiglu:
        return y
    f = wd.shape[0] // 2
    h = cp.empty((m, f), cp.float32)
    flat_launch("swiglu_rows", h.size, (y, h, np.int32(f), np.int64(h.size)))
    return h


def fused(x: Any, wd: Any, norm: Any, res: Any, swiglu: bool, form: tuple[int, int],
          eps: float = EPS) -> Any:
    n = wd.shape[0] // 2 if swiglu else wd.shape[0]
    out = cp.full((x.shape[0], n), cp.nan, cp.float32)  # an unwritten output shows
    return lm.linear_mma(x, wd, out, res, form=form, norm=norm, eps=eps, swiglu=swiglu)


@pytest.mark.parametrize("n,k", NK)
@pytest.mark.parametrize("mode", ("norm", "norm+residual", "norm+swiglu", "swiglu"))
def test_fused_rows_forms_give_the_separate_kernels_bits(n: int, k: int, mode: str) -> None:
    x, wd, norm_w, res_all = case(n, k, n + 3 * k)
    swiglu, norm = "swiglu" in mode, norm_w if "norm" in mode else None
    ran = set()
    for m in MS:
        forms = [f for f in lm.ROW_FORMS if lm.fits(n, k, f, norm is not None, m)
                 and (not swiglu or f[0] % 2 == 0)]
        # The model's K = 576 takes a form at every M; K = 1536's staged rows only fit a few.
        assert forms or (k == 1536 and norm is not None and m > 2), (mode, m)
        res = res_all[:m] if mode == "norm+residual" else None
        ref = unfused(x[:m], wd, norm, res, swiglu)
        assert bool(cp.isfinite(ref).all())
        for form in forms:
            got = fused(x[:m], wd, norm, res, swiglu, form)
            assert same(got, ref), f"{mode} form {form} M={m}"
            ran.add(form)
    assert len(ran) >= 2


@pytest.mark.parametrize("swiglu", (False, True))
def test_fused_controls_differ(swiglu: bool) -> None:
    x, wd, norm, _ = case(3072, 576, 5)
    m = lm.FUSE_MAX_ROWS  # the largest step the backend fuses
    form = lm.fused_form(m, 3072, 576, swiglu)
    assert form is not None and lm.fused_form(m + 1, 3072, 576, swiglu) is None
    ref = fused(x[:m], wd, norm, None, swiglu, form)
    assert same(ref, unfused(x[:m], wd, norm, None, swiglu))
    assert not same(fused(x[:m], wd, norm, None, swiglu, form, eps=1e-3), ref)
    bumped = norm.copy()
    bumped[7] = cp.nextafter(bumped[7], cp.float32(np.inf))
    assert not same(fused(x[:m], wd, bumped, None, swiglu, form), ref)


def test_swiglu_epilogue_alone_and_its_control() -> None:
    """Where the backend may run it (past FUSE_MAX_ROWS, up to the rows kernel's 64 rows of
    gate/up), the epilogue alone == linear_mma then swiglu_rows; one ulp more in one up
    column's scale changes that column's outputs."""
    x, wd, _, _ = case(3072, 576, 6)
    for m in (3, 40, 64):
        form = lm.fused_form(m, 3072, 576, True, norm=False)
        assert form is not None
        ref = unfused(x[:m], wd, None, None, True)
        assert same(fused(x[:m], wd, None, None, True, form), ref), m
    assert lm.fused_form(65, 3072, 576, True, norm=False) is None  # the tile kernel's size
    scale = wd.scale.copy()
    wd.scale[1536 + 5] = cp.nextafter(wd.scale[1536 + 5], cp.float32(np.inf))
    got = fused(x[:64], wd, None, None, True, (2, 12))
    wd.scale[...] = scale
    diff = cp.nonzero(cp.any(got.view(cp.uint32) != ref.view(cp.uint32), axis=0))[0]
    assert diff.tolist() == [5]


def test_fused_refuses_what_it_cannot_run() -> None:
    x, wd, norm, res = case(3072, 576, 9)
    out = cp.empty((16, 1536), cp.float32)
    with pytest.raises(ValueError, match="residual"):
        lm.linear_mma(x[:16], wd, out, res[:16], norm=norm, swiglu=True)
    with pytest.raises(ValueError, match="contiguous f32"):
        lm.linear_mma(x[:16], wd, cp.empty((16, 3072), cp.float32), norm=norm[:64])
    with pytest.raises(ValueError, match="fused rows form"):
        lm.linear_mma(x[:16], wd, out, norm=norm, swiglu=True, form=(1, 12))
    # K = 1536 at NT = 4: the block values take all 48 KiB, none left for the norm's.
    _, wk, nk, _ = case(576, 1536, 2)
    assert lm.fits(576, 1536, (4, 8)) and not lm.fits(576, 1536, (4, 8), norm=True)
    with pytest.raises(ValueError, match="does not fit"):
        lm.linear_mma(cp.zeros((4, 1536), cp.float32), wk, cp.empty((4, 576), cp.float32),
                      norm=nk, form=(4, 8))
