"""cuda/linear_mma.cu and linear_mma_rows.cu on a real GPU (skipped without CuPy or a
device): every form of both kernels gives the rows of one 1,024-row launch bit for bit at
every M, with and without the residual, on the model's shapes and small edges; rows in
another order and huge values in other rows change nothing; the error against float64 is
f32-sized. Negative controls: the one-accumulator form (another order of the same
products) must differ, as must linear.cu's fma order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.kernels import linear as ck  # noqa: E402
from crucible.kernels import linear_mma as lm  # noqa: E402
from crucible.kernels.device_weight import upload_weight  # noqa: E402

NK = ((960, 576), (576, 1536), (64, 64), (128, 192))
M_ALL = (1, 2, 15, 16, 17, 64, 65, 300, 1024)


def same(a: Any, b: Any) -> bool:
    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def case(n: int, k: int, seed: int) -> tuple[np.ndarray, Any, Any, Any]:
    rng = np.random.default_rng(seed)
    xh = (rng.standard_normal((1024, k)) * 10.0 ** rng.uniform(-2, 2, (1024, 1)))
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    wd = upload_weight(codes, (0.001 + 0.02 * rng.random(n)).astype(np.float32))
    res = cp.asarray(rng.standard_normal((1024, n)).astype(np.float32))
    return xh.astype(np.float32), cp.asarray(xh.astype(np.float32)), wd, res


@pytest.mark.parametrize("n,k", NK)
@pytest.mark.parametrize("with_res", (False, True))
def test_every_form_and_m_gives_the_same_rows(n: int, k: int, with_res: bool) -> None:
    _, x, wd, res = case(n, k, n + k)
    wdb = upload_weight(wd.w.get(), wd.scale.get(), bf16=True)  # the same codes, + bf16
    res = res if with_res else None
    ref = lm.linear_mma(x, wd, cp.empty((1024, n), cp.float32), res, form=lm.CONTROL)
    forms = [f for f in lm.FORMS + lm.ROW_FORMS + lm.ROW1_FORMS if lm.fits(n, k, f)]
    assert len(forms) >= 4 and all(f in forms for f in lm.ROW1_FORMS)
    for form in forms:
        for m in M_ALL:
            if len(form) == 2 and m > 300 or len(form) == 1 and m != 1:
                continue
            r = None if res is None else res[:m]
            # The tile forms with their loads a block ahead and without (PF_MAX_CTAS picks),
            # and with the codes as bf16 (BW: DeviceWeight.wb).
            for pf, w in ([(p, v) for p in (False, True) for v in (wd, wdb)]
                          if len(form) == 4 else [(None, wd)]):
                got = lm.linear_mma(x[:m], w, cp.full((m, n), cp.nan, cp.float32), r,
                                    form=form, prefetch=pf, bf16=w is wdb or None)
                assert same(got, ref[:m]), f"form {form} M={m} prefetch={pf} bf16={w is wdb}"


@pytest.mark.parametrize("n,k", NK[:2])
def test_rows_are_independent_of_their_neighbours(n: int, k: int) -> None:
    _, x, wd, _ = case(n, k, 7)
    ref = lm.linear_mma(x, wd, cp.empty((1024, n), cp.float32))
    perm = cp.asarray(np.random.default_rng(1).permutation(1024))
    assert same(lm.linear_mma(x[perm], wd, cp.empty((1024, n), cp.float32)), ref[perm])
    loud = x[:40].copy()
    loud[1:] = cp.float32(3e38)
    for form in ((2, 8), (1, 2, 2, 2)):
        got = lm.linear_mma(loud, wd, cp.empty((40, n), cp.float32), form=form)
        assert same(got[0], ref[0]), form


@pytest.mark.parametrize("n,k", NK[:2])
def test_error_is_f32_sized_and_the_controls_differ(n: int, k: int) -> None:
    xh, x, wd, _ = case(n, k, 3)
    codes, scale = wd.w.get().astype(np.float64), wd.scale.get().astype(np.float64)
    y64 = (xh.astype(np.float64) @ codes.T) * scale
    mag = (np.abs(xh.astype(np.float64)) @ np.abs(codes.T)) * scale
    got = lm.linear_mma(x, wd, cp.empty((1024, n), cp.float32))
    assert float((np.abs(got.get() - y64) / mag).max()) < 4e-7
    for form in (lm.CONTROL, lm.ROW_CONTROL):
        m = 1024 if len(form) == 4 else 64
        ctl = lm.linear_mma(x[:m], wd, cp.empty((m, n), cp.float32), form=form, one_acc=True)
        assert not same(ctl, got[:m]), form
    fma = ck.linear(x, wd, cp.empty((1024, n), cp.float32))
    assert not same(fma, got)


def test_one_row_form_on_the_lm_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch-1 LM head's shape (49,152 x 576) takes the one-row form once routed
    (pick_form), which gives the tile kernel's row with and without the residual, and fused
    with the RMSNorm prologue the bits of rmsnorm_rows then the GEMM; the one-accumulator
    control differs."""
    from crucible.kernels.model_ops import rows_launch

    n, k = 49152, 576
    _, x, wd, res = case(n, k, 11)
    monkeypatch.setattr(lm, "ROW1_ROUTED", True)
    assert lm.pick_form(1, n, k) == lm.ROW1_FORMS[0] != lm.pick_form(2, n, k)
    assert lm.fused_form(1, n, k) == lm.ROW1_FORMS[0] and lm.fused_form(1, n, k, True) is None
    tile = {r: lm.linear_mma(x[:16], wd, cp.empty((16, n), cp.float32),
                             None if r is None else res[:16], form=(1, 2, 1, 4))
            for r in (None, "res")}
    for form in lm.ROW1_FORMS:
        for r in (None, "res"):
            got = lm.linear_mma(x[:1], wd, cp.full((1, n), cp.nan, cp.float32),
                                None if r is None else res[:1], form=form)
            assert same(got, tile[r][:1]), f"form {form} residual={r is not None}"
    norm = cp.asarray((0.5 + np.random.default_rng(3).random(k)).astype(np.float32))
    xn = cp.empty((1, k), cp.float32)
    rows_launch("rmsnorm_rows", 1, (x[:1], norm, xn, np.int32(k), np.float32(1e-5)))
    separate = lm.linear_mma(xn, wd, cp.empty((1, n), cp.float32), form=(1, 2, 1, 4))
    fused = lm.linear_mma(x[:1], wd, cp.full((1, n), cp.nan, cp.float32), norm=norm, eps=1e-5)
    assert same(fused, separate)
    control = lm.linear_mma(x[:16], wd, cp.empty((16, n), cp.float32), form=lm.CONTROL,
                            one_acc=True)
    assert not same(control[:1], tile[None][:1])  # the same products in another order


def test_bf16_codes_are_routed_and_checked() -> None:
    """A weight uploaded with bf16=True holds its codes exactly as bf16 (each code's f32 top
    half); linear_mma takes them where bw_wanted says (the same rows as the int8 codes),
    and asking for them on a weight without them, or with the control, is a clear error."""
    n, k = 2048, 192
    _, x, wd, _ = case(n, k, 5)
    wdb = upload_weight(wd.w.get(), wd.scale.get(), bf16=True)
    codes = wd.w.get().astype(np.float32)
    top = (wdb.wb.get().astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(top, codes)
    assert not lm.bw_wanted(lm.BW_WIDE_FROM_M - 1, n) and lm.bw_wanted(lm.BW_WIDE_FROM_M, n)
    assert not lm.bw_wanted(lm.BW_FROM_M - 1, 960) and lm.bw_wanted(lm.BW_FROM_M, 960)
    for m in (lm.BW_WIDE_FROM_M - 1, lm.BW_WIDE_FROM_M, 600):
        a = lm.linear_mma(x[:m], wd, cp.empty((m, n), cp.float32))
        b = lm.linear_mma(x[:m], wdb, cp.full((m, n), cp.nan, cp.float32))
        assert same(a, b), f"M={m}"
    with pytest.raises(ValueError, match="bf16=True"):
        lm.linear_mma(x[:256], wd, cp.empty((256, n), cp.float32), bf16=True)
    with pytest.raises(ValueError, match="bf16=True"):
        lm.linear_mma(x[:256], wdb, cp.empty((256, n), cp.float32), form=lm.CONTROL,
                      one_acc=True, bf16=True)
