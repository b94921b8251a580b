"""The tensor-core int8 GEMM (cuda/linear_mma.cu, cuda/linear_mma_rows.cu for few rows and
cuda/linear_mma_row1.cu for one row of a wide weight, the batch-1 LM head):
exact products of x's three bf16 parts with the int8 codes, f32 accumulation in a fixed
order of its own (not linear.cu's), so its bits are its own and the same for every launch
shape (``FORMS``, ``ROW_FORMS``, ``ROW1_FORMS``) and every M.

``linear()`` (linear.cu's order) never routes here: a run takes one order for all its
GEMMs, and the CuPy backend calls this for every int8 GEMM under ``gemm="mma"``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.kernels import linear_wgmma as lw
from crucible.kernels.device_weight import DeviceWeight, check_linear, check_out, check_x, need
from crucible.kernels.launch import launch
from crucible.kernels.source import KernelModule, cached_module

# (MT, NT, WM, WN): a warp's 16 MT x 8 NT tile, WM x WN warps a CTA.
FORMS: tuple[tuple[int, int, int, int], ...] = (
    (1, 2, 2, 2), (1, 2, 1, 4), (1, 4, 2, 2), (2, 2, 2, 2), (2, 4, 2, 2), (1, 1, 4, 2),
    (4, 2, 1, 4), (2, 4, 4, 1),
)
CONTROL = (1, 2, 2, 2)  # the form of the one-accumulator negative control
# (NT, warps): linear_mma_rows' 16 x 8 NT tile a CTA, its K blocks over ``warps`` warps.
ROW_FORMS: tuple[tuple[int, int], ...] = ((1, 8), (2, 8), (4, 8), (2, 4), (1, 12), (2, 12))
ROW_CONTROL = (2, 8)  # the rows kernel's control form
# (PB,): linear_mma_row1, one row, a warp per 16 columns, its first PB K blocks' codes loaded
# before the PDL wait, the rest streamed after it. The first is the routed one: 2 (an engine
# decoding at batch 1 under mma, bench/gpu-generate-mma-row1-h200.json: 1,880 tok/s at PB 2,
# 1,855-1,866 at 9, which holds all of the default model's K = 576, 1,830 on the tile
# kernel; alone, 8.6 / 11.1 / 21.2 us: bench/gemm-mma-row1-h200.json).
ROW1_FORMS: tuple[tuple[int], ...] = ((2,), (9,))
ROW1_THREADS = 256
# The one-row form from this many columns: the LM head (49,152 x 576) at one row took 23 us
# on the tile kernel against 12.9 for linear.cu's row kernel (bench/gemm-mma-h200.json).
ROW1_FROM_N = 8192
# pick_form routes one row of such a weight to it (H200: tests/test_gpu_linear_mma.py bitwise
# against the tile kernel's row, memcheck and racecheck clean: bench/mma-row1-*-h200.log).
# Benches switch it off to time the tile kernel instead.
ROW1_ROUTED = True
SMEM_DEFAULT = 48 * 1024
NORM_SMEM = (16 * 8 + 16) * 4  # linear_mma_rows' static red[] and inv[] under NORM
# bench/mma-fused-h200.json (graphs with PDL, us per RMSNorm -> GEMM (-> SwiGLU)): fused
# 4.3 vs 6.1 (gate/up) and 3.3 vs 4.0 (QKV) at one row, 4.9 vs 6.3 and 3.8 vs 4.1 at two,
# QKV 4.8 vs 4.2 at four, 2-3x slower from 16 rows on, when the prologue summed its rows'
# squares from global memory. It stages them in shared memory now (linear_mma_rows.cu).
FUSE_MAX_ROWS = 2


# The tile kernel's loads a block ahead (PF) in grids of at most this many CTAs (about two
# waves of the H200's 132 SMs): there nothing else hides a block's loads (qkv, o and down at
# 64-256 rows 1.26-1.6x); in larger grids the registers PF takes cost more occupancy than it
# saves (gate/up at 256-1,024 rows 0.88-0.94x with it). bench/gemm-mma-prefetch-h200.json.
PF_MAX_CTAS = 264
# The codes as bf16 (DeviceWeight.wb, the BW forms) where loading them beats converting
# int8: from 512 rows (qkv, o, down at 1,024 rows 1.11-1.16x), and from 128 on the wide
# shapes (gate/up 1.04-1.10x, the LM head 1.02-1.03x); below, twice the bytes cost more than
# the conversion saves (qkv, o, down at 256 rows 0.94-0.97x). bench/gemm-mma-bw-h200.json.
BW_FROM_M, BW_WIDE_FROM_M = 512, 128


def bw_wanted(m: int, n: int) -> bool:
    return m >= (BW_WIDE_FROM_M if n >= 2048 else BW_FROM_M)


def _b(v: bool) -> str:  # a template argument
    return "true" if v else "false"


def _name(form: tuple[int, int, int, int], one_acc: bool, pf: bool = False,
          bw: bool = False) -> str:
    mt, nt, wm, wn = form
    tail = ", true" if bw else ""
    return f"linear_mma<{mt}, {nt}, {wm}, {wn}, {_b(one_acc)}, {_b(pf)}{tail}>"


def _row_name(nt: int, one_acc: bool, norm: bool = False, swiglu: bool = False) -> str:
    return f"linear_mma_rows<{nt}, {_b(one_acc)}, {_b(norm)}, {_b(swiglu)}>"


_NAMES = tuple(_name(f, False, pf, bw) for f in FORMS for pf in (False, True)
               for bw in (False, True)) + (_name(CONTROL, True),)
# Plain for every NT; the RMSNorm prologue for every NT; the SwiGLU epilogue, with or without
# the prologue, for the even ones (it pairs gate and up tiles).
ROW_FUSED = (tuple((nt, True, sw) for nt in (1, 2, 4) for sw in (False, True) if nt % 2 == 0
                   or not sw) + tuple((nt, False, True) for nt in (2, 4)))
_ROW_NAMES = (tuple(_row_name(nt, False) for nt in (1, 2, 4)) + (_row_name(2, True),)
              + tuple(_row_name(nt, False, n, sw) for nt, n, sw in ROW_FUSED))


_ROW1_NAMES = tuple(f"linear_mma_row1<{pb}, {_b(nm)}>"
                    for (pb,) in ROW1_FORMS for nm in (False, True))


def modules() -> tuple[KernelModule, ...]:
    """The tile kernel's, the rows kernel's and the one-row kernel's modules."""
    return (cached_module("linear_mma.cu", _NAMES), cached_module("linear_mma_rows.cu", _ROW_NAMES),
            cached_module("linear_mma_row1.cu", _ROW1_NAMES))


@functools.cache
def kernel(form: tuple[int, ...], one_acc: bool = False, norm: bool = False,
           swiglu: bool = False, pf: bool = False, bw: bool = False) -> Any:
    tiles, rows, row1 = modules()
    if len(form) == 1:
        return row1.get_function(f"linear_mma_row1<{form[0]}, {_b(norm)}>")
    if len(form) == 2:
        return rows.get_function(_row_name(form[0], one_acc, norm, swiglu))
    return tiles.get_function(_name(form, one_acc, pf, bw))


def row_smem(k: int, nt: int, norm_rows: int = 0) -> int:
    """linear_mma_rows' dynamic shared memory: the block values, and under the RMSNorm
    prologue its CTA's rows of x (``norm_rows``: min(16, M))."""
    return (k // 64) * 16 * 8 * nt * 4 + 4 * k * min(16, norm_rows)


def fits(n: int, k: int, form: tuple[int, ...], norm: bool = False, m: int = 16) -> bool:
    """The kernels' shape rules: whole 64-wide K blocks, whole CTA column tiles; a rows
    form's block values (and with ``norm`` the prologue's staged rows of an M-row launch and
    its static 576 bytes) in 48 KiB; the one-row form's B fragments (384 bytes a block) too."""
    if len(form) == 1:
        return k % 64 == 0 and n % 16 == 0 and 384 * (k // 64) <= SMEM_DEFAULT
    nt, wn = (form[0], 1) if len(form) == 2 else (form[1], form[3])
    return k % 64 == 0 and n % (8 * nt * wn) == 0 and (
        len(form) == 4 or row_smem(k, nt, m if norm else 0) + NORM_SMEM * norm <= SMEM_DEFAULT)


def supports(n: int, k: int) -> bool:
    """Whether a weight [N, K] runs here at every M (a form of each kernel fits); one that
    does not keeps linear.cu's order, the same for every M, so a weight's order is fixed."""
    return k % 64 == 0 and n % 16 == 0 and row_smem(k, 1) <= SMEM_DEFAULT


def pick_form(m: int, n: int, k: int) -> tuple[int, ...]:
    """A form for the shape, by bench/gemm-mma-h200.json (fastest or within 7% at each of
    the default model's shapes); any form gives the same bits. The rows kernel up to 128
    rows (the LM head's 49,152 columns give the tile kernel enough CTAs from 2 rows)."""
    head, wide = n >= 8192, n >= 2048
    if ROW1_ROUTED and m == 1 and n >= ROW1_FROM_N:
        order: tuple[tuple[int, ...], ...] = (ROW1_FORMS[0],)
    elif head:
        order = ((1, 2, 1, 4),) if m <= 32 else ((2, 4, 2, 2),)
    elif m <= 16:
        order = ((1, 12), (1, 8))
    elif m <= 64 or (m <= 128 and not wide):
        order = ((2, 12), (1, 12))
    elif m >= 512 and wide:
        order = ((2, 4, 4, 1), (2, 4, 2, 2))
    else:
        order = ((1, 4, 2, 2), (1, 2, 1, 4))
    for form in order + FORMS + ROW_FORMS:
        if fits(n, k, form):
            return form
    raise ValueError(f"linear_mma: no form fits N={n}, K={k}")


def fused_form(m: int, n: int, k: int, swiglu: bool = False,
               max_rows: int | None = None, norm: bool = True) -> tuple[int, ...] | None:
    """The rows form that runs RMSNorm (``norm``) and/or SwiGLU inside the GEMM at this
    shape, or None where the stages stay separate (same bits): with ``norm`` past
    ``max_rows`` (FUSE_MAX_ROWS: there the prologue costs more than the launch it saves),
    and wherever pick_form takes the tile kernel."""
    if not norm and not swiglu:
        return None
    if norm and m > (FUSE_MAX_ROWS if max_rows is None else max_rows):
        return None
    form = pick_form(m, n, k)
    if len(form) == 1:  # the one-row form has the RMSNorm prologue, not the SwiGLU epilogue
        return None if swiglu or not fits(n, k, form, norm=True) else form
    if len(form) != 2:
        return None
    if swiglu and form[0] % 2:
        form = (form[0] + 1, form[1])
    return (form[0], form[1]) if fits(n, k, form, norm, m) else None


def linear_mma(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
               form: tuple[int, ...] | None = None, one_acc: bool = False,
               pdl: bool = False, norm: Any = None, eps: float = 0.0,
               swiglu: bool = False, prefetch: bool | None = None,
               bf16: bool | None = None, wgmma: bool = False) -> Any:
    """out[M, N] = (x @ codes^T) * scale (+ residual), int8 weights only. ``pdl``: launch
    with programmatic dependent launch (launch.py); the bits are the same either way.
    ``norm`` (f32 [K]) and ``eps``: RMSNorm x first, as rmsnorm_rows does; ``swiglu``: the
    weight is gate/up [2F, K] and out [M, F] = swiglu(gate, up), as swiglu_rows does. Either
    needs a rows form, and ``norm`` alone may take the one-row form (``fused_form``); they
    give the bits of the separate kernels. ``prefetch``: the tile kernel's loads a block
    ahead or not (None: by the grid's size, PF_MAX_CTAS); ``bf16``: the tile kernel reads
    ``wd.wb``, the codes as bf16 (None: where it pays, bw_wanted); the same bits either way.
    ``wgmma``: a plain GEMM (no form, fusion or control asked for) that
    ``linear_wgmma.route`` takes runs on the warpgroup-MMA kernel, which gives these bits
    (CRUCIBLE_WGMMA)."""
    import cupy as cp

    if swiglu:  # out is [M, F]: check_linear's [M, N] does not apply
        need(residual is None, "linear_mma: the SwiGLU epilogue takes no residual")
        n, k = wd.shape
        check_x(x, k)
        m = x.shape[0]
        check_out(out, (m, n // 2), "out")
    else:
        m, n, k = check_linear(x, wd, out, residual)
    need(wd.dtype_name == "int8", "linear_mma: int8 weights only")
    if norm is not None or swiglu:  # the compiled fused forms: NORM, EPI or both (ROW_FUSED)
        need(norm is None or (tuple(norm.shape) == (k,) and norm.dtype == np.float32
                              and norm.flags.c_contiguous),
             f"linear_mma: norm weight must be contiguous f32 [{k}]")
        need(not one_acc, "linear_mma: the one-accumulator control has no fused form")
        form = form or fused_form(m, n, k, swiglu, max_rows=m, norm=norm is not None)
        need(form is not None and len(form) in (1, 2) and not (swiglu and (
            len(form) == 1 or form[0] % 2)), f"linear_mma: no fused rows form for M={m}, "
             f"N={n}, K={k}")
    for a in (x, wd.w, out, residual, norm):
        need(a is None or a.data.ptr % 16 == 0, "linear_mma: arrays must be 16-byte aligned")
    if (wgmma and norm is None and not swiglu and not one_acc and form is None
            and prefetch is None and bf16 is None and (wf := lw.route(m, wd)) is not None):
        return lw.run(x, wd, out, residual, wf, pdl=pdl)  # checked above: it only launches
    plan = _plan(m, n, k, form, one_acc, norm is not None, swiglu, prefetch, bf16,
                 wd.wb is not None, ROW1_ROUTED)
    if m == 0:
        return out
    res = residual if residual is not None else np.uint64(0)  # a null pointer
    nw = norm if norm is not None else np.uint64(0)
    if plan.kind == 1:
        args = (x, wd.w, wd.scale, res, out, cp.int32(n), cp.int32(k), nw, np.float32(eps))
    else:
        args = (x, wd.wb if plan.bf16 else wd.w, wd.scale, res, out, cp.int32(m),
                cp.int32(n), cp.int32(k)) + ((nw, np.float32(eps)) if plan.kind == 2 else ())
    launch(plan.fn, plan.grid, plan.block, args, plan.smem, pdl=pdl)
    return out


@dataclass(frozen=True)
class Plan:
    """A launch's kernel and shape: kind 1 (the one-row form), 2 (rows), 4 (tile); bf16:
    the tile kernel reads ``wd.wb``."""

    fn: Any
    grid: tuple[int, ...]
    block: tuple[int, ...]
    smem: int
    kind: int
    bf16: bool


@functools.lru_cache(maxsize=4096)
def _plan(m: int, n: int, k: int, form: tuple[int, ...] | None, one_acc: bool, norm: bool,
          swiglu: bool, prefetch: bool | None, bf16: bool | None, has_wb: bool,
          row1_routed: bool) -> Plan:
    """What linear_mma launches for these arguments, once per distinct set (an eager step's
    ~120 GEMMs repeat a few shapes; the rules and the kernel lookup cost host time).
    ``row1_routed``: ROW1_ROUTED when asked, which pick_form reads (a bench may switch it),
    so that a cached plan never outlives the routing it was made under."""
    form = form or pick_form(m, n, k)
    need(fits(n, k, form, norm, m), f"linear_mma: form {form} does not fit N={n}, K={k}")
    need(len(form) != 1 or (m <= 1 and not one_acc),
         f"linear_mma: the one-row form {form} takes one row and no control, got M={m}")
    if len(form) == 1:
        warps = ROW1_THREADS // 32
        return Plan(kernel(form, norm=norm), (-(-(n // 16) // warps),), (ROW1_THREADS,),
                    384 * (k // 64), 1, False)
    if len(form) == 2:
        nt, warps = form
        return Plan(kernel(form, one_acc, norm, swiglu), (n // (8 * nt), -(-m // 16)),
                    (32 * min(warps, k // 64),), row_smem(k, nt, m if norm else 0), 2, False)
    mt, nt, wm, wn = form
    grid = (n // (8 * nt * wn), -(-m // (16 * mt * wm)))
    pf = not one_acc and (grid[0] * grid[1] <= PF_MAX_CTAS if prefetch is None else prefetch)
    has_wb = has_wb and not one_acc  # the codes as bf16: loaded, not converted
    need(has_wb or not bf16,
         "linear_mma: bf16=True needs a weight uploaded with bf16=True and no control")
    bw = has_wb and (bw_wanted(m, n) if bf16 is None else bf16)
    return Plan(kernel(form, one_acc, pf=pf, bw=bw), grid, (32 * wm * wn,), 0, 4, bw)
