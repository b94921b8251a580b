"""The tensor-core GEMM order of linear_mma.cu on the warpgroup MMA (sm_90a):
cuda/linear_wgmma.cu from FROM_M rows (``ROUTE``); cuda/linear_wgmma_rows.cu (K blocks over
warpgroups, for fewer rows) is built and checked but not routed, being slower than
linear_mma there. On where the GPU is sm_90 (``CRUCIBLE_WGMMA``: auto; ``enable``). It
gives linear_mma's bits (same blocks, steps, slots, parts and sums): on the H200,
bench/wgmma-probe-h200.json (wgmma's step sums are mma.sync's),
tests/test_gpu_linear_wgmma.py and bench/wgmma-gemm-h200.json.

``linear_mma.linear_mma(..., wgmma=True)`` routes here (``run``) where ``route`` says so;
a weight needs its codes in the kernel's order (``upload_weight(..., wgmma=True)``:
``wd.wg``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import numpy as np

from crucible.errors import ConfigError
from crucible.kernels.device_weight import DeviceWeight, check_linear, need
from crucible.kernels.launch import launch

# (BN, S): columns a CTA (one warpgroup, 64 rows) and cp.async stages. BN 16 doubles the
# CTAs of a mid-M grid (qkv at 256 rows: 240 instead of 120) for the same x traffic a CTA.
FORMS: tuple[tuple[int, int], ...] = ((32, 3), (16, 4), (32, 4), (64, 3))
# Which form an M x N GEMM takes, the first entry with M >= from_m and N >= min_n: the
# fastest per layer shape in bench/wgmma-gemm-h200.json (time over linear_mma's, H200). Below
# 128 rows linear_mma stays faster (a 64-row tile then is mostly padding, or N / BN CTAs walk
# all of K); from 128 rows a wide N (gate_up, 3,072) gains 0.81x, from 256 every layer
# 0.79-0.93x, from 512 BN 64 0.67-0.92x.
ROUTE: tuple[tuple[int, int, tuple[int, int]], ...] = (
    (512, 0, (64, 3)), (256, 2048, (64, 3)), (256, 0, (32, 3)), (128, 2048, (64, 3)))
FROM_M = min(from_m for from_m, _, _ in ROUTE)
# (BN, W): linear_wgmma_rows.cu's columns a CTA and warpgroups taking the K blocks in turn.
# Not routed: at 16-64 rows it took 1.2-2.8x linear_mma's time on the H200 (the same JSON),
# and at 128 0.92-1.33x, where the tile kernel's wide-N form does better.
ROW_FORMS: tuple[tuple[int, int], ...] = ((16, 3), (16, 2))
# linear_wgmma's SwiGLU epilogue forms (linear_wgmma_swiglu_<BN>_<S>): the gate/up GEMM and
# swiglu_rows in one launch, with their bits (the host driver; tests/test_gpu_linear_wgmma.py).
SWIGLU_FORMS: tuple[tuple[int, int], ...] = ((64, 3), (32, 3))
# Rows [lo, hi) where gate/up stays GEMM then swiglu_rows. In the graphs on an H100 the
# epilogue replayed the 256-row decode step 1.066x slower (its overlap with the down GEMM
# after it under PDL; 0.963x with PDL off) and 128, 192, 384, 512 rows and the chat cohort
# (~960) 0.965-0.982x (bench/wgmma-swiglu-ab-h100.json). The graphs' rows between 256 and
# 384 are the 256 and 320 buckets; 320 is left out with 256 until it is measured.
SWIGLU_SKIP_ROWS: tuple[tuple[int, int], ...] = ((256, 384),)
SMEM_OPTIN = 227 * 1024  # the H200's dynamic shared memory a CTA may opt into
ARCH = "sm_90a"


def _stage_bytes(bn: int) -> int:
    """One cp.async stage (cuda/wgmma_stage.cuh): x's 64 x 64 f32 block and BN x 64 bf16."""
    return 64 * 64 * 4 + bn * 64 * 2


def smem_bytes(form: tuple[int, int]) -> int:
    """linear_wgmma's dynamic shared memory: S stages."""
    bn, stages = form
    return stages * _stage_bytes(bn)


SOURCES = ("linear_wgmma.cu", "linear_wgmma_rows.cu")  # one sm_90a program each


def builds() -> list[Callable[[], Any]]:
    """A call per source that builds (or loads from the kernel cache) its cubin now, for the
    start-up prebuild (backend/cupy_prebuild.py)."""
    from crucible.kernels.source import cached_arch_module

    return [functools.partial(cached_arch_module, name, ARCH) for name in SOURCES]


def _tile_kernel(name: str, form: tuple[int, int]) -> Any:
    """linear_wgmma.cu's ``name``_<BN>_<S>, with its dynamic shared memory opted into."""
    from crucible.kernels.loader import ensure_dynamic_smem
    from crucible.kernels.source import cached_arch_module

    bn, stages = form
    fn = cached_arch_module(SOURCES[0], ARCH).get_function(f"{name}_{bn}_{stages}")
    ensure_dynamic_smem(fn, smem_bytes(form))
    return fn


@functools.cache
def kernel(form: tuple[int, int]) -> Any:
    return _tile_kernel("linear_wgmma", form)


@functools.cache
def swiglu_kernel(form: tuple[int, int]) -> Any:
    return _tile_kernel("linear_wgmma_swiglu", form)


def require_device() -> None:
    """At start-up, a ConfigError naming the setting unless this GPU runs the kernels (their
    cubins are sm_90a: Hopper only) and NVRTC builds them (else the first GEMM of 128 rows
    would fail mid-run)."""
    import cupy

    cc = str(cupy.cuda.Device().compute_capability)
    if cc != "90":
        raise ConfigError(f"CRUCIBLE_WGMMA=1: the wgmma GEMM needs an sm_90 GPU (Hopper); "
                          f"this one is sm_{cc}")
    try:
        for form in dict.fromkeys(form for _, _, form in ROUTE):
            kernel(form)
    except RuntimeError as e:  # cached_arch_module's build error, with NVRTC's log
        raise ConfigError(f"CRUCIBLE_WGMMA=1: {e}") from e


def enable(asked: bool | None) -> bool:
    """Whether the backend routes GEMMs here: True insists (``require_device``'s errors);
    None (auto) takes it where the GPU is sm_90 and NVRTC builds the kernels, else stays on
    linear_mma, with a warning on a Hopper whose build failed: the bits are the same either
    way, only the speed differs."""
    try:
        require_device()
    except ConfigError as e:
        if asked:
            raise
        import cupy

        if str(cupy.cuda.Device().compute_capability) == "90":
            warnings.warn(f"the warpgroup-MMA GEMMs are off: {e}", RuntimeWarning, 2)
        return False
    return True


def fits(n: int, k: int, form: tuple[int, int] = FORMS[0]) -> bool:
    return k % 64 == 0 and n % form[0] == 0


def rows_smem(form: tuple[int, int], k: int) -> int:
    """linear_wgmma_rows' dynamic shared memory: two stages a warpgroup, the block values."""
    bn, warpgroups = form
    return 2 * warpgroups * _stage_bytes(bn) + 64 * bn * 4 * (k // 64)


def rows_fits(n: int, k: int, form: tuple[int, int] = ROW_FORMS[0]) -> bool:
    return k % 64 == 0 and n % form[0] == 0 and rows_smem(form, k) <= SMEM_OPTIN


def route(m: int, wd: DeviceWeight) -> tuple[int, int] | None:
    """The form an M-row GEMM of ``wd`` runs in on the tile kernel (``ROUTE``), or None for
    linear_mma: also None unless its codes were uploaded in the kernel's order."""
    return None if wd.wg is None else _route(m, *wd.shape)


@functools.lru_cache(maxsize=4096)
def _route(m: int, n: int, k: int) -> tuple[int, int] | None:
    # Cached like linear_mma's _plan: every eager GEMM launch asks, with few distinct shapes.
    for from_m, min_n, form in ROUTE:
        if m >= from_m and n >= min_n and fits(n, k, form):
            return form
    return None


def swiglu_route(m: int, wd: DeviceWeight) -> tuple[int, int] | None:
    """The SwiGLU epilogue's form for an M-row gate/up GEMM where ``route`` takes the tile
    kernel in a form that has one, else None (the GEMM and swiglu_rows stay apart; also in
    SWIGLU_SKIP_ROWS)."""
    if any(lo <= m < hi for lo, hi in SWIGLU_SKIP_ROWS):
        return None
    form = route(m, wd)
    return form if form in SWIGLU_FORMS and wd.shape[0] % (2 * form[0]) == 0 else None


def linear_wgmma_swiglu(x: Any, wd: DeviceWeight, out: Any, *, form: tuple[int, int],
                        pdl: bool = False) -> Any:
    """out[M, F] = swiglu(gate, up) of the gate/up weight ``wd`` [2F, K]: linear_wgmma's
    GEMM with the SwiGLU epilogue (cuda/linear_wgmma.cu, EPI), the bits of the plain GEMM
    then swiglu_rows."""
    n, k = wd.shape
    m = x.shape[0]
    need(wd.dtype_name == "int8" and wd.wg is not None,
         "linear_wgmma: int8 weights uploaded with wgmma=True only")
    need(form in SWIGLU_FORMS, f"linear_wgmma: form {form} has no SwiGLU epilogue")
    need(k % 64 == 0 and n % (2 * form[0]) == 0,
         f"linear_wgmma: the SwiGLU form {form} does not fit N={n}, K={k}")
    need(tuple(x.shape) == (m, k) and tuple(out.shape) == (m, n // 2),
         f"linear_wgmma: SwiGLU takes x [M, {k}] and out [M, {n // 2}], got "
         f"{tuple(x.shape)} and {tuple(out.shape)}")
    for a in (x, out):
        need(a.dtype == np.float32 and a.flags.c_contiguous and a.data.ptr % 16 == 0,
             "linear_wgmma: x and out must be contiguous, 16-byte aligned f32")
    if m:
        import cupy as cp

        launch(swiglu_kernel(form), (n // form[0], -(-m // 64)), (128,),
               (x, wd.wg, wd.scale, out, cp.int32(m), cp.int32(n), cp.int32(k), cp.int32(0)),
               smem_bytes(form), pdl=pdl)
    return out


def run(x: Any, wd: DeviceWeight, out: Any, residual: Any, form: tuple[int, int], *,
        pdl: bool = False) -> Any:
    """The tile kernel in ``route``'s form, for linear_mma: it has checked the arrays
    already, so this only launches."""
    return _launch(kernel(form), form[0], 128, smem_bytes(form), x, wd, out, residual, 0, pdl)


@functools.cache
def rows_kernel(form: tuple[int, int]) -> Any:
    from crucible.kernels.source import cached_arch_module

    bn, warpgroups = form
    return cached_arch_module(SOURCES[1], ARCH).get_function(
        f"linear_wgmma_rows_{bn}_{warpgroups}")


def linear_wgmma(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
                 form: tuple[int, int] = FORMS[0], pdl: bool = False, mode: int = 0) -> Any:
    """out[M, N] = (x @ codes^T) * scale (+ residual), int8 weights uploaded with ``wgmma``.
    ``mode``: which descriptor field carries the core matrices' K distance (0, the PTX
    manual's reading; 1 swaps them: bench/wgmma_gemm.py's check of that reading)."""
    n, k = _checked(x, wd, out, residual, mode)
    need(form in FORMS, f"linear_wgmma: form {form} is not one of {FORMS}")
    need(fits(n, k, form), f"linear_wgmma: form {form} does not fit N={n}, K={k}")
    return _launch(kernel(form), form[0], 128, smem_bytes(form), x, wd, out, residual, mode,
                   pdl)


def linear_wgmma_rows(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
                      form: tuple[int, int] = ROW_FORMS[0], pdl: bool = False,
                      mode: int = 0) -> Any:
    """linear_wgmma's product for few rows: K blocks over W warpgroups a CTA, their values
    added from the first once all are in (cuda/linear_wgmma_rows.cu); the same bits."""
    n, k = _checked(x, wd, out, residual, mode)
    need(form in ROW_FORMS, f"linear_wgmma_rows: form {form} is not one of {ROW_FORMS}")
    need(rows_fits(n, k, form), f"linear_wgmma_rows: form {form} does not fit N={n}, K={k}")
    return _launch_rows(form, x, wd, out, residual, mode, pdl)


def _checked(x: Any, wd: DeviceWeight, out: Any, residual: Any, mode: int) -> tuple[int, int]:
    _, n, k = check_linear(x, wd, out, residual)
    need(wd.dtype_name == "int8" and wd.wg is not None,
         "linear_wgmma: int8 weights uploaded with wgmma=True only")
    need(mode in (0, 1), f"linear_wgmma: mode must be 0 or 1, got {mode!r}")
    for a in (x, out, residual):
        need(a is None or a.data.ptr % 16 == 0, "linear_wgmma: arrays must be 16-byte aligned")
    return n, k


def _launch_rows(form: tuple[int, int], x: Any, wd: DeviceWeight, out: Any, residual: Any,
                 mode: int, pdl: bool) -> Any:
    from crucible.kernels.loader import ensure_dynamic_smem

    fn, smem = rows_kernel(form), rows_smem(form, wd.shape[1])
    ensure_dynamic_smem(fn, smem)  # the block values' share grows with K
    return _launch(fn, form[0], 128 * form[1], smem, x, wd, out, residual, mode, pdl)


def _launch(fn: Any, bn: int, threads: int, smem: int, x: Any, wd: DeviceWeight, out: Any,
            residual: Any, mode: int, pdl: bool) -> Any:
    """Either kernel's launch: grid (N / BN, ceil(M / 64)), the same arguments."""
    import cupy as cp

    m, (n, k) = x.shape[0], wd.shape
    if m == 0:
        return out
    res = residual if residual is not None else np.uint64(0)  # a null pointer
    launch(fn, (n // bn, -(-m // 64)), (threads,),
           (x, wd.wg, wd.scale, res, out, cp.int32(m), cp.int32(n), cp.int32(k),
            cp.int32(mode)), smem, pdl=pdl)
    return out
