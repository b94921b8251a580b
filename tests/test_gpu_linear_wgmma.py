"""cuda/linear_wgmma.cu and linear_wgmma_rows.cu on a real GPU (skipped without CuPy or a
device; sm_90 only): every form gives linear_mma's bits at every M, with and without the
residual, on the model's shapes and small edges, and so does linear_mma's routing to them
(CRUCIBLE_WGMMA=1's path).
Negative controls: the one-accumulator form (another order of the same products) must
differ, and so must the kernel with its descriptor's offset fields swapped (mode 1), which
reads the codes wrongly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.kernels import linear_mma as lm  # noqa: E402
from crucible.kernels import linear_wgmma as lw  # noqa: E402
from crucible.kernels.device_weight import upload_weight  # noqa: E402

NK = ((960, 576), (576, 1536), (3072, 576), (64, 192))
M_ALL = (1, 63, 64, 65, 128, 300, 1024)


@pytest.fixture(autouse=True)
def _hopper() -> None:
    if str(cp.cuda.Device().compute_capability) != "90":
        pytest.skip("the wgmma kernel is built for sm_90a")


def same(a: Any, b: Any) -> bool:
    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def case(n: int, k: int, seed: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    xh = (rng.standard_normal((1024, k)) * 10.0 ** rng.uniform(-2, 2, (1024, 1)))
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    wd = upload_weight(codes, (0.001 + 0.02 * rng.random(n)).astype(np.float32), bf16=True,
                       wgmma=True)
    res = cp.asarray(rng.standard_normal((1024, n)).astype(np.float32))
    return cp.asarray(xh.astype(np.float32)), wd, res


@pytest.mark.parametrize("n,k", NK)
@pytest.mark.parametrize("with_res", (False, True))
def test_every_form_and_m_gives_linear_mmas_bits(n: int, k: int, with_res: bool) -> None:
    x, wd, res = case(n, k, n + k)
    res = res if with_res else None
    ref = lm.linear_mma(x, wd, cp.empty((1024, n), cp.float32), res, form=(1, 2, 2, 2))
    forms = [f for f in lw.FORMS if lw.fits(n, k, f)]
    assert forms
    for form in forms:
        for m in M_ALL:
            r = None if res is None else res[:m]
            got = lw.linear_wgmma(x[:m], wd, cp.full((m, n), cp.nan, cp.float32), r, form=form)
            assert same(got, ref[:m]), f"form {form} M={m}"
    for form in [f for f in lw.ROW_FORMS if lw.rows_fits(n, k, f)]:  # K over warpgroups
        for m in (1, 16, 63, 64, 65, 128):
            r = None if res is None else res[:m]
            got = lw.linear_wgmma_rows(x[:m], wd, cp.full((m, n), cp.nan, cp.float32), r,
                                       form=form)
            assert same(got, ref[:m]), f"rows form {form} M={m}"
    for m in (64, lw.FROM_M, 256, 300, 512, 1024):  # the routed path (and below it)
        r = None if res is None else res[:m]
        got = lm.linear_mma(x[:m], wd, cp.full((m, n), cp.nan, cp.float32), r, wgmma=True)
        assert same(got, ref[:m]), f"routed M={m}"


def test_negative_controls_differ() -> None:
    x, wd, _ = case(960, 576, 7)
    got = lw.linear_wgmma(x, wd, cp.empty((1024, 960), cp.float32))
    one_acc = lm.linear_mma(x, wd, cp.empty((1024, 960), cp.float32), form=lm.CONTROL,
                            one_acc=True)
    swapped = lw.linear_wgmma(x, wd, cp.empty((1024, 960), cp.float32), mode=1)
    assert not same(got, one_acc) and not same(got, swapped)


def test_the_swiglu_epilogue_gives_the_gemm_then_swiglu_bits() -> None:
    # linear_wgmma_swiglu against linear_mma_rows' SwiGLU epilogue (the bits of the GEMM then
    # swiglu_rows, tests/test_gpu_mma_fused.py) on gate/up's shape and a small one; the same
    # launch with the halves swapped (up as gate) must differ.
    for n, k in ((3072, 576), (256, 192)):
        x, wd, _ = case(n, k, n + 3 * k)
        f = n // 2
        ref = lm.linear_mma(x, wd, cp.empty((1024, f), cp.float32), form=(2, 12), swiglu=True)
        for form in [fm for fm in lw.SWIGLU_FORMS if n % (2 * fm[0]) == 0]:
            for m in (1, 63, 64, 65, 128, 300, 1024):
                got = lw.linear_wgmma_swiglu(x[:m], wd, cp.full((m, f), cp.nan, cp.float32),
                                             form=form)
                assert same(got, ref[:m]), f"swiglu form {form} N={n} M={m}"
        assert lw.swiglu_route(1024, wd) in lw.SWIGLU_FORMS and lw.swiglu_route(64, wd) is None
    codes = cp.asnumpy(wd.w)
    swapped = upload_weight(np.concatenate([codes[f:], codes[:f]]),
                            cp.asnumpy(cp.concatenate([wd.scale[f:], wd.scale[:f]])),
                            bf16=True, wgmma=True)
    other = lw.linear_wgmma_swiglu(x, swapped, cp.empty((1024, f), cp.float32),
                                   form=lw.SWIGLU_FORMS[0])
    assert not same(other, ref)
