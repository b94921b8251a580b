"""The tensor-core int8 GEMM for many rows with x split once per CTA (cuda/linear_mma_smem.cu):
linear_mma.cu's order and bits, its K blocks of x cut into bf16 parts once in shared memory
instead of by every warp, the codes read as bf16 (``DeviceWeight.wb``).

A form is ``(WM, WN, DB)``: WM x WN warps, a 32 WM x 32 WN tile a CTA; DB splits the next
block into a second parts buffer while this one's mmas run (one barrier a block, not two). Any form gives the same bits as
every linear_mma form (tests/test_gpu_linear_mma.py).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from crucible.kernels.device_weight import DeviceWeight, check_linear, need
from crucible.kernels.launch import launch
from crucible.kernels.loader import ensure_dynamic_smem
from crucible.kernels.source import cached_module

FORMS: tuple[tuple[int, int, bool], ...] = tuple(
    (wm, wn, kb) for wm, wn in ((2, 2), (4, 2), (2, 4), (1, 4)) for kb in (True, False))
ROW_BYTES = 136  # a staged row: 64 bf16 and 4 of padding (CRU_SM_ROW)


def _name(form: tuple[int, int, bool]) -> str:
    wm, wn, kb = form
    return f"linear_mma_smem<{wm}, {wn}, {'true' if kb else 'false'}>"


@functools.cache
def kernel(form: tuple[int, int, bool]) -> Any:
    return cached_module("linear_mma_smem.cu", tuple(_name(f) for f in FORMS)).get_function(
        _name(form))


def smem_bytes(form: tuple[int, int, bool]) -> int:
    """The parts of 32 WM rows (three planes, twice with DB) and two stages of 32 WN
    columns' codes."""
    wm, wn, db = form
    return ROW_BYTES * ((2 if db else 1) * 3 * 32 * wm + 2 * 32 * wn)


def fits(n: int, k: int, form: tuple[int, int, bool]) -> bool:
    """Whole 64-wide K blocks and whole CTA column tiles."""
    return k % 64 == 0 and n % (32 * form[1]) == 0


def linear_mma_smem(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
                    form: tuple[int, int, bool], pdl: bool = False) -> Any:
    """out[M, N] = (x @ codes^T) * scale (+ residual) in the tensor-core order; needs the
    weight's codes as bf16 (``upload_weight(..., bf16=True)``)."""
    m, n, k = check_linear(x, wd, out, residual)
    need(wd.wb is not None, "linear_mma_smem: the weight needs its codes as bf16 (wb)")
    need(form in FORMS and fits(n, k, form),
         f"linear_mma_smem: form {form} does not fit N={n}, K={k}")
    for a in (x, wd.wb, out, residual):
        need(a is None or a.data.ptr % 16 == 0, "linear_mma_smem: arrays must be 16-byte aligned")
    return launch_form(x, wd, out, residual, form, m, n, k, pdl)


def launch_form(x: Any, wd: DeviceWeight, out: Any, residual: Any,
                form: tuple[int, int, bool], m: int, n: int, k: int, pdl: bool) -> Any:
    """The launch alone, for callers that have checked the arguments (linear_mma)."""
    import cupy as cp

    if m == 0:
        return out
    wm, wn, _ = form
    fn, smem = kernel(form), smem_bytes(form)
    ensure_dynamic_smem(fn, smem)
    res = residual if residual is not None else np.uint64(0)  # a null pointer
    launch(fn, (n // (32 * wn), -(-m // (32 * wm))), (32 * wm * wn,),
           (x, wd.wb, wd.scale, res, out, cp.int32(m), cp.int32(n), cp.int32(k)), smem, pdl=pdl)
    return out
