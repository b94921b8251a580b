"""upload_weight on a real GPU (skipped without CuPy or a device): the layouts it now makes
on the device (the transpose, the bf16 codes, the wgmma image) are byte for byte the ones
the host functions make, which the GEMM tests were written against."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.kernels.device_weight import codes_bf16, codes_wgmma, upload_weight  # noqa: E402


@pytest.mark.parametrize("n, k", [(960, 576), (3072, 576), (576, 1536), (72, 64)])
def test_device_layouts_equal_the_host_ones(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    codes = rng.integers(-128, 128, (n, k)).astype(np.int8)
    scale = rng.random(n).astype(np.float32)
    wd = upload_weight(codes, scale, bf16=True, wgmma=True)
    assert np.array_equal(cp.asnumpy(wd.w), codes)
    wt = cp.asnumpy(wd.wt)
    assert wt.flags.c_contiguous and np.array_equal(wt, codes.T)
    assert np.array_equal(cp.asnumpy(wd.wb), codes_bf16(codes))
    assert np.array_equal(cp.asnumpy(wd.wg), codes_wgmma(codes))
    assert not np.array_equal(cp.asnumpy(wd.wg), codes_bf16(codes).reshape(-1))  # reordered


def test_f32_weights_keep_their_values_and_transpose() -> None:
    w = np.random.default_rng(1).standard_normal((96, 128)).astype(np.float32)
    wd = upload_weight(w)
    assert wd.scale is None and wd.wb is None and wd.wg is None
    assert np.array_equal(cp.asnumpy(wd.w).view(np.uint32), w.view(np.uint32))
    assert np.array_equal(cp.asnumpy(wd.wt).view(np.uint32), w.T.view(np.uint32))
