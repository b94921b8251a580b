"""The tensor-core GEMM order of linear_mma.cu on the warpgroup MMA (cuda/linear_wgmma.cu,
sm_90a), for large M. Experimental and off by default (``CRUCIBLE_WGMMA=1``): it is meant to
give linear_mma's bits (same blocks, steps, slots, parts and sums), which only the GPU can
confirm (bench/wgmma_probe.py, bench/wgmma_gemm.py, tests/test_gpu_linear_wgmma.py); until
then the backend names it in its arithmetic, so the prefix cache never mixes the two.

``linear_mma.linear_mma(..., wgmma=True)`` routes here where ``routes`` says so; a weight
needs its codes in the kernel's order (``upload_weight(..., wgmma=True)``: ``wd.wg``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from crucible.errors import ConfigError
from crucible.kernels.device_weight import DeviceWeight, check_linear, need
from crucible.kernels.launch import launch

# (BN, S): columns a CTA (one warpgroup, 64 rows) and cp.async stages. The first is routed
# until bench/wgmma_gemm.py has timed them: 127 registers, four CTAs an SM by registers and
# three by shared memory (60 KiB each). BN 16 doubles the CTAs of a mid-M grid (qkv at 256
# rows: 240 instead of 120) for the same x traffic a CTA.
FORMS: tuple[tuple[int, int], ...] = ((32, 3), (16, 4), (32, 4), (64, 3))
# Rows from which a GEMM routes here: below, a 64-row tile leaves most SMs idle (N / 32
# CTAs a 64 rows), where linear_mma's rows kernel splits K instead.
FROM_M = 128
ARCH = "sm_90a"


def smem_bytes(form: tuple[int, int]) -> int:
    """Dynamic shared memory of a launch: S stages of x's 64 x 64 f32 and BN x 64 bf16."""
    bn, stages = form
    return stages * (64 * 64 * 4 + bn * 64 * 2)


@functools.cache
def kernel(form: tuple[int, int]) -> Any:
    from crucible.kernels.loader import ensure_dynamic_smem
    from crucible.kernels.source import cached_arch_module

    bn, stages = form
    fn = cached_arch_module("linear_wgmma.cu", ARCH).get_function(f"linear_wgmma_{bn}_{stages}")
    ensure_dynamic_smem(fn, smem_bytes(form))
    return fn


def require_device() -> None:
    """A ConfigError naming the setting unless this GPU runs the kernel (its cubin is
    sm_90a: Hopper only)."""
    import cupy

    cc = str(cupy.cuda.Device().compute_capability)
    if cc != "90":
        raise ConfigError(f"CRUCIBLE_WGMMA=1: the wgmma GEMM needs an sm_90 GPU (Hopper); "
                          f"this one is sm_{cc}")


def fits(n: int, k: int, form: tuple[int, int] = FORMS[0]) -> bool:
    return k % 64 == 0 and n % form[0] == 0


def routes(m: int, wd: DeviceWeight) -> bool:
    """Whether an M-row GEMM of ``wd`` runs here: enough rows, its codes uploaded in the
    kernel's order, a shape the routed form takes."""
    n, k = wd.shape
    return m >= FROM_M and wd.wg is not None and fits(n, k)


def linear_wgmma(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
                 form: tuple[int, int] = FORMS[0], pdl: bool = False, mode: int = 0) -> Any:
    """out[M, N] = (x @ codes^T) * scale (+ residual), int8 weights uploaded with ``wgmma``.
    ``mode``: which descriptor field carries the core matrices' K distance (0, the PTX
    manual's reading; 1 swaps them: bench/wgmma_gemm.py's check of that reading)."""
    import cupy as cp

    m, n, k = check_linear(x, wd, out, residual)
    need(wd.dtype_name == "int8" and wd.wg is not None,
         "linear_wgmma: int8 weights uploaded with wgmma=True only")
    need(form in FORMS, f"linear_wgmma: form {form} is not one of {FORMS}")
    need(fits(n, k, form), f"linear_wgmma: form {form} does not fit N={n}, K={k}")
    need(mode in (0, 1), f"linear_wgmma: mode must be 0 or 1, got {mode!r}")
    for a in (x, out, residual):
        need(a is None or a.data.ptr % 16 == 0, "linear_wgmma: arrays must be 16-byte aligned")
    if m == 0:
        return out
    res = residual if residual is not None else np.uint64(0)  # a null pointer
    launch(kernel(form), (n // form[0], -(-m // 64)), (128,),
           (x, wd.wg, wd.scale, res, out, cp.int32(m), cp.int32(n), cp.int32(k),
            cp.int32(mode)), smem_bytes(form), pdl=pdl)
    return out
