"""upload_weight on a real GPU (skipped without CuPy or a device): the layouts it makes on
the device (the transpose, the bf16 codes, the wgmma image) are byte for byte the ones the
host functions make, which the GEMM tests were written against. The checks are
tests/test_device_weight.py's, which runs them on the CPU with a numpy stand-in."""

from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from test_device_weight import SHAPES, check_f32_layouts, check_int8_layouts  # noqa: E402


@pytest.mark.parametrize("n, k", SHAPES)
def test_device_layouts_equal_the_host_ones(n: int, k: int) -> None:
    check_int8_layouts(n, k, cp.asnumpy)


def test_f32_weights_keep_their_values_and_transpose() -> None:
    check_f32_layouts(cp.asnumpy)
