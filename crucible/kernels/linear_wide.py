"""The large-M GEMM (cuda/linear_wide.cu): prefill-size steps and the LM head, bit for bit
the tiled kernel's (cuda/linear.cu), which stays as the baseline and the fallback.

Why: linear_tiled's 4x4 register tile is bound by shared-memory reads (about 24 TFLOP/s of
the H200's ~51 in f32), and its 64x64 tiles leave the narrow GEMMs (N = 576: o, down) with
144 CTAs for 132 SMs. Here a thread runs an 8x4 tile, stages through cp.async double
buffers, and a CTA may split K over G groups of warps (chunk r*G + g in round r; the round's
partials meet in shared memory and are added in ascending chunk order), so narrow shapes
get more threads per output tile. The canonical order is untouched, so the pick of form
never changes a bit; only the speed does.

A form is (BM, BN, G, WK): a BM x BN output tile per CTA, G*BM*BN/32 threads, stages of WK
k. ``pick_form`` chooses one by shape (bench/gemm_bench.py --sweep times every form).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from crucible.kernels.device_weight import (KC, DeviceWeight, check_linear, ctype, gemm_args,
                                            need)
from crucible.kernels.loader import ensure_dynamic_smem, sm_count, smem_optin_limit
from crucible.kernels.source import cached_module

Form = tuple[int, int, int, int]  # (BM, BN, G, WK)

# Every form cuda/linear_wide.cu instantiates offline (its CRU_WIDE_FORMS list).
FORMS: tuple[Form, ...] = tuple((bm, bn, g, wk) for wk in (16, 32) for bm, bn, g in (
    (64, 64, 1), (64, 128, 1), (64, 64, 2), (32, 64, 2), (64, 32, 2), (64, 64, 3), (32, 64, 3),
    (32, 32, 3), (64, 64, 4), (32, 64, 4), (32, 32, 4)) if (bm, bn, g, wk) not in (
    (64, 32, 2, 32), (32, 32, 4, 32), (64, 64, 4, 32)))  # (the last spills in f32)
# Rows from which linear() runs its tiled branch here: measured faster than linear_tiled
# from 128 rows on all five default-model shapes, the LM head included (which takes the
# tiled branch from linear.HEAD_TILED_FROM = 36 rows; 36..127 are not measured yet and stay
# on linear_tiled). Below 128 the row and chunk kernels serve the other GEMMs.
WIDE_FROM = 128


def threads(form: Form) -> int:
    bm, bn, g, _ = form
    return g * bm * bn // 32


def smem_bytes(form: Form) -> int:
    """Two stage buffers (x [BM][16G + 4], w [16G][BN]) plus G*BM*BN floats: the round's
    partials (G > 1) or the totals (G = 1)."""
    bm, bn, g, wk = form
    return 4 * (2 * (bm * (wk * g + 4) + wk * g * bn) + g * bm * bn)


def kernel_name(wdtype: str, form: Form) -> str:
    bm, bn, g, wk = form
    return f"linear_wide<{ctype(wdtype)}, {bm}, {bn}, {g}, {wk}>"


@functools.cache  # one RawKernel per form: its shared-memory opt-in is set on that object
def wide_kernel(name: str) -> Any:
    return cached_module("linear_wide.cu", (name,)).get_function(name)


def ctas(m: int, n: int, form: tuple[int, ...]) -> int:
    bm, bn = form[:2]
    return -(-m // bm) * -(-n // bn)


def pick_form(m: int, n: int, k: int) -> Form:
    """The form for an [m, k] x [k, n] product, by how many 64x64 output tiles it has per
    SM: the thresholds come from bench/gemm_bench.py --sweep on the H200 (132 SMs), every
    form on the default model's five shapes at M = 128..2048. A thread's 32 chains need ~16 warps per SM to reach the kernel's ~35
    TFLOP/s; 64x64 tiles of one K group give that from ~2 tiles per SM (4 CTAs of 4 warps
    resident). Fewer tiles split K over 3 or 4 groups (9 chunks at K = 576: 3 divides
    them, 4 leaves a round a quarter full); just over one wave of 64x64 tiles (o and down
    at M = 1024: 144 for 132 SMs) runs 32x32 tiles instead, four times as many CTAs, so
    the last wave is short. Stages of 32 k (half the barriers) win wherever the shared
    memory still fits the CTAs per SM the form needs."""
    chunks = -(-k // KC)
    per_sm = ctas(m, n, (64, 64)) / sm_count()
    if per_sm >= 2.1 or chunks == 1:
        return (64, 64, 1, 32)  # wide N or many rows: gate_up from 512, the LM head
    if per_sm >= 1.5 or chunks == 2:
        return (64, 64, 2, 32)  # QKV at 1024 rows
    if per_sm > 1.0:
        return (32, 32, 3, 16)  # o and down at 1024 rows: a wave and a bit of 64x64 tiles
    if per_sm >= 0.4:
        return (64, 64, 3, 32)  # one wave: o, down and QKV at 512 rows, gate_up at 128
    return (32, 32, 4, 16)  # o, down and QKV at 128 rows


def use_wide(m: int, n: int, k: int) -> bool:
    """Whether linear() runs [m, k] x [k, n] here rather than on linear_tiled: from
    WIDE_FROM rows, where it measured faster (1.25-2.6x on the default model's shapes)."""
    return m >= WIDE_FROM and k > 0 and n > 0


def aligned(*arrays: Any) -> bool:
    """Every given device array starts on a 16-byte boundary (None is skipped): the
    kernel's vector loads and stores assume it."""
    return all(a is None or int(a.data.ptr) % 16 == 0 for a in arrays)


def linear_wide(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
                form: Form | None = None) -> Any:
    """out[M, N] = x[M, K] @ W^T (int8: times scale[N]), plus ``residual`` added last, on
    cuda/linear_wide.cu. ``form`` overrides ``pick_form`` (tests and the bench: the bits
    do not depend on it). Every argument is checked first: a wrong array is a ValueError
    here, never an out-of-bounds read on the device."""
    m, n, k = check_linear(x, wd, out, residual)
    wdt = wd.dtype_name
    need(wdt in ("float32", "int8") and tuple(wd.wt.shape) == (k, n)
         and wd.wt.flags.c_contiguous and str(wd.wt.dtype) == wdt,
         "linear_wide: the weight needs its contiguous [K, N] transpose wt, f32 or int8")
    if wdt == "int8":
        need(wd.scale is not None and tuple(wd.scale.shape) == (n,)
             and wd.scale.dtype == np.float32, f"linear_wide: int8 needs f32 scale[{n}]")
    form = pick_form(m, n, k) if form is None else tuple(form)
    need(form in FORMS, f"linear_wide: form {form} is not built {FORMS}")
    need(aligned(x, wd.wt, wd.scale, out, residual),
         "linear_wide: x, wt, scale, out and residual must start on 16-byte boundaries")
    return launch_wide(x, wd, out, residual, form)


def launch_wide(x: Any, wd: DeviceWeight, out: Any, residual: Any = None,
                form: Form | None = None) -> Any:
    """The launch over arguments already checked (``linear`` checks them, and its weights
    are DeviceWeights made by upload_weight, so only what depends on M is checked here)."""
    n, k = wd.shape
    m = x.shape[0]
    form = pick_form(m, n, k) if form is None else form
    need(-(-m // form[0]) <= 65535, f"linear_wide: {m} rows is past the grid's y limit")
    if m == 0:
        return out
    smem = smem_bytes(form)
    need(smem <= smem_optin_limit(), f"linear_wide: form {form} needs {smem} B of shared "
         "memory, more than this device allows")
    fn = wide_kernel(kernel_name(wd.dtype_name, form))
    ensure_dynamic_smem(fn, smem)
    fn((-(-n // form[1]), -(-m // form[0])), (threads(form),),
       gemm_args(x, wd, out, residual), shared_mem=smem)
    return out
