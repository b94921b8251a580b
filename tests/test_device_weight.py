"""upload_weight's wiring, on the CPU: with a numpy stand-in for CuPy, every layout it makes
from the one uploaded array (the transpose, the bf16 codes, the wgmma image) is the one the
host functions make. tests/test_gpu_device_weight.py runs the same checks against CuPy on a
device, where the conversions themselves are CuPy's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest

from crucible.kernels import device_weight
from crucible.kernels.device_weight import codes_bf16, codes_wgmma, upload_weight

SHAPES = [(960, 576), (3072, 576), (576, 1536), (72, 64)]


def check_int8_layouts(n: int, k: int, host: Callable[[Any], np.ndarray]) -> None:
    """The int8 weight's four layouts against the host functions', byte for byte; ``host``
    brings an array back from the device."""
    rng = np.random.default_rng(n + k)
    codes = rng.integers(-128, 128, (n, k)).astype(np.int8)
    scale = rng.random(n).astype(np.float32)
    wd = upload_weight(codes, scale, bf16=True, wgmma=True)
    assert np.array_equal(host(wd.w), codes)
    wt = host(wd.wt)
    assert wt.flags.c_contiguous and np.array_equal(wt, codes.T)
    assert np.array_equal(host(wd.scale), scale)
    assert np.array_equal(host(wd.wb), codes_bf16(codes))
    assert np.array_equal(host(wd.wg), codes_wgmma(codes))
    assert not np.array_equal(host(wd.wg), codes_bf16(codes).reshape(-1))  # reordered


def check_f32_layouts(host: Callable[[Any], np.ndarray]) -> None:
    w = np.random.default_rng(1).standard_normal((96, 128)).astype(np.float32)
    wd = upload_weight(w, bf16=True, wgmma=True)  # asked for, but f32 weights have none
    assert wd.scale is None and wd.wb is None and wd.wg is None
    assert np.array_equal(host(wd.w).view(np.uint32), w.view(np.uint32))
    assert np.array_equal(host(wd.wt).view(np.uint32), w.T.view(np.uint32))


@pytest.fixture
def numpy_device(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = SimpleNamespace(asarray=np.asarray, ascontiguousarray=np.ascontiguousarray)
    monkeypatch.setattr(device_weight, "cupy", lambda: stand_in)


@pytest.mark.parametrize("n, k", SHAPES)
def test_int8_layouts(numpy_device: None, n: int, k: int) -> None:
    check_int8_layouts(n, k, np.asarray)


def test_f32_layouts(numpy_device: None) -> None:
    check_f32_layouts(np.asarray)


def test_wgmma_image_only_for_its_shapes(numpy_device: None) -> None:
    codes = np.ones((12, 64), np.int8)  # N % 8 != 0: linear_wgmma.cu cannot take it
    wd = upload_weight(codes, np.ones(12, np.float32), bf16=True, wgmma=True)
    assert wd.wg is None and wd.wb is not None


@pytest.mark.parametrize("bf16, wgmma", [(True, False), (False, True), (False, False)])
def test_each_layout_only_on_request(numpy_device: None, bf16: bool, wgmma: bool) -> None:
    codes = np.random.default_rng(3).integers(-128, 128, (64, 128)).astype(np.int8)
    wd = upload_weight(codes, np.ones(64, np.float32), bf16=bf16, wgmma=wgmma)
    assert (wd.wb is not None) == bf16 and (wd.wg is not None) == wgmma
    if bf16:
        assert np.array_equal(wd.wb, codes_bf16(codes))
    if wgmma:
        assert np.array_equal(wd.wg, codes_wgmma(codes))
