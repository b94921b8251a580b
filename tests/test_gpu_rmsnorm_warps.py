"""RMSNorm a warp a row (cuda/model_ops.cu rmsnorm_warps) gives rmsnorm_rows' bits, and both
give the CPU kernel's (skipped without CuPy or a device). Rows at scales 1e-3..1e3, widths
across the register row's edges (D not a multiple of 32, of 256, and the widest it takes),
row counts across the 8-row block's edge. Negative controls: a row summed in plain index
order, and the same kernel with another eps, must change bits, so the comparison sees an
order's rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.backend import cpu_ext, cpu_ops  # noqa: E402
from crucible.kernels.model_ops import WARP_ROW_MAX, rmsnorm_launch  # noqa: E402

EPS = 1e-5
DS = (64, 100, 256, 576, 777, 32 * WARP_ROW_MAX)
TS = (1, 7, 8, 9, 300)


def rows(t: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, d)) * 10.0 ** rng.uniform(-3, 3, (t, 1))
    return x.astype(np.float32), (0.5 + rng.random(d)).astype(np.float32)


def gpu_norm(x: np.ndarray, w: np.ndarray, warps: bool, eps: float = EPS,
             pdl: bool = False) -> np.ndarray:
    xd, wd = cp.asarray(x), cp.asarray(w)
    y = cp.full(x.shape, cp.nan, cp.float32)  # an unwritten element shows
    rmsnorm_launch(xd, wd, y, eps, warps=warps, pdl=pdl)
    return cp.asnumpy(y)


def bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("t", TS)
def test_warp_rows_give_the_block_rows_bits(t: int, d: int) -> None:
    x, w = rows(t, d, seed=t * 1000 + d)
    warp = gpu_norm(x, w, warps=True)
    assert np.array_equal(bits(warp), bits(gpu_norm(x, w, warps=False)))
    assert np.array_equal(bits(warp), bits(gpu_norm(x, w, warps=True, pdl=True)))
    if cpu_ext.extension() is not None:  # not built on the GPU machine
        assert np.array_equal(bits(warp), bits(cpu_ops.rmsnorm(x, w, EPS)))


def test_wider_rows_fall_back_to_block_rows() -> None:
    x, w = rows(9, 32 * WARP_ROW_MAX + 64, seed=5)
    assert np.array_equal(bits(gpu_norm(x, w, warps=True)), bits(gpu_norm(x, w, warps=False)))


def test_controls_change_bits() -> None:
    x, w = rows(300, 576, seed=11)
    warp = gpu_norm(x, w, warps=True)
    # The same arithmetic with the sum of squares taken in plain index order.
    ss = np.zeros(x.shape[0], np.float32)
    for d in range(x.shape[1]):
        ss = (ss + x[:, d] * x[:, d]).astype(np.float32)
    inv = (np.float32(1) / np.sqrt(ss / np.float32(576) + np.float32(EPS))).astype(np.float32)
    plain = (x * inv[:, None]).astype(np.float32) * w
    assert not np.array_equal(bits(warp), bits(plain))
    assert not np.array_equal(bits(warp), bits(gpu_norm(x, w, warps=True, eps=2e-5)))
