"""The CPU GEMM and the GPU GEMM give identical bits for identical inputs (needs CuPy + GPU).

Both compute cuda/linear.cu's canonical order, so ``kernels.linear.linear`` (whichever GPU
kernel it picks for M) and the compiled CPU GEMM must agree bit for bit, f32 and int8, with
and without the fused residual. Where the checkout has no built extension (a PYTHONPATH
run), it is compiled into a temporary folder first.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from crucible.backend import cpu_ext
from crucible.backend.cpu_gemm import pack_weight
from tests.cpu_reference import build_extension

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    found = cpu_ext.extension() or build_extension(tmp_path_factory.mktemp("cpu_ext"))
    if found is None:
        pytest.skip("the compiled CPU kernels are not built and cannot be built here")
    return found


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("weights", ["f32", "int8"])
@pytest.mark.parametrize("k", [576, 1536, 100])
@pytest.mark.parametrize("m", [1, 3, 64, 200])
def test_cpu_and_gpu_gemm_bits_agree(ext: ModuleType, m: int, k: int, weights: str) -> None:
    import cupy as cp

    from crucible.kernels import linear as ck
    from crucible.kernels.device_weight import upload_weight

    rng = np.random.default_rng(m * 10_000 + k)
    for n in (960, 100):
        x = rng.standard_normal((m, k)).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        if weights == "int8":
            w = rng.integers(-127, 128, (n, k)).astype(np.int8)
            scale = (rng.random(n) * 0.02 + 1e-3).astype(np.float32)
        else:
            w, scale = rng.standard_normal((n, k)).astype(np.float32), None
        packed = pack_weight(w, scale)
        dev = upload_weight(w, scale)
        for r in (None, res):
            cpu = np.empty((m, n), dtype=np.float32)
            ext.gemm(x, packed.panels, packed.scale, r, cpu, m, n, k, 2, True)
            gpu = cp.empty((m, n), dtype=cp.float32)
            ck.linear(cp.asarray(x), dev, gpu, None if r is None else cp.asarray(r))
            got = cp.asnumpy(gpu)
            bad = np.flatnonzero(_bits(got) != _bits(cpu))
            assert bad.size == 0, (f"n={n} residual={r is not None}: {bad.size} of {got.size} "
                                   f"differ, first at {np.unravel_index(bad[0], got.shape)}: "
                                   f"gpu {got.flat[bad[0]]!r} cpu {cpu.flat[bad[0]]!r}")
