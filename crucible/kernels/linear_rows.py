"""The fused decode-size GEMMs: RMSNorm -> GEMM -> store (+ residual) / SwiGLU / RoPE + K/V
store, on the row kernels (cuda/linear_rows.cu: 1, 4 or 8 rows per CTA, batches up to 128).
They keep the canonical order of cuda/linear.cu, so the host may pick them or the tiled
kernel by shape and the bits never change. Wrappers check every array before a launch (a
clear ValueError, never an out-of-bounds read on the device). The variants tried and the
timings behind the constants below: docs/gpu-engine.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.kernels.device_weight import EPI_ROPE  # noqa: F401 (the forms' ids, re-exported)
from crucible.kernels.device_weight import (EPI_STORE, EPI_SWIGLU, KC, DeviceWeight, check_out,
                                            check_x, ctype, cupy, need)
from crucible.kernels.launch import launch
from crucible.kernels.loader import ensure_dynamic_smem, sm_count
from crucible.kernels.source import KernelModule, cached_module

# Column-block CTAs per SM before a CTA takes several blocks (N large: the LM head); the
# one-row LM head is fastest at 2.
CTAS_PER_SM = 4
HEAD_CTAS_PER_SM = 2
COMBINE_MAX_PARTS = 24  # CRU_MAX_PARTS (cuda/rows_chunk.cuh): chunk partials one combine adds
ROWS_MAX_M = 128  # up to here the row kernels (linear_rows.cu); above, the tiled one
ROWS_MAX_K = 1536  # the row kernels give each 64-wide K chunk its own warp (<= 24 warps)
ROWS_MAX_K_PAIRED = 768  # one-row SwiGLU and RoPE forms are compiled for <= 12 warps

# (prologue, epilogue) pairs the backend uses: plain/residual, norm + plain (LM head),
# norm + SwiGLU (gate/up), norm + RoPE + K/V store (QKV).
_ROWS_FORMS = ((0, 0), (1, 0), (1, 1), (1, 2))


def rows_mt(m: int) -> int:
    """Rows per block of the row kernels: never more than needed for tiny M; 4 up to 64
    rows (twice the CTAs of 8, faster per layer), then 8."""
    return 1 if m == 1 else 4 if m <= 64 else 8


def _rows_name(wdtype: str, mt: int, pro: int, epi: int) -> str:
    return f"linear_rows<{ctype(wdtype)}, {mt}, {pro}, {epi}>"


# The mma-order QKV of the decode stack (int8, one row, norm + RoPE): linear_rows.cu's MMA.
MMA_QKV = "linear_rows<signed char, 1, 1, 2, true>"
_ROWS_NAMES = tuple(_rows_name(d, mt, pro, epi) for d in ("float32", "int8")
                    for mt in (1, 4, 8) for pro, epi in _ROWS_FORMS) + (MMA_QKV,)


def module() -> KernelModule:
    return cached_module("linear_rows.cu", _ROWS_NAMES)


@functools.cache
def fused_kernel(name: str) -> Any:
    return module().get_function(name)


@dataclass(frozen=True)
class RopeStore:
    """Where the QKV epilogue rotates and stores: step metadata, tables, pools, layer."""

    positions: Any
    pages: Any
    slots: Any
    cos: Any
    sin: Any
    k_pool: Any
    v_pool: Any
    layer: int
    n_heads: int
    n_kv: int


def rows_max_k(m: int, epi: int) -> int:
    return ROWS_MAX_K_PAIRED if epi != EPI_STORE and rows_mt(m) == 1 else ROWS_MAX_K


def use_rows(m: int, k: int, epi: int = 0) -> bool:
    return m <= ROWS_MAX_M and k <= rows_max_k(m, epi)


@dataclass(frozen=True)
class _Form:
    """One fused GEMM call, checked: rows, K, output width, column blocks of 32 (or heads),
    columns per lane, and the RoPE arguments (null pointers unless epi is EPI_ROPE)."""

    m: int
    k: int
    n_out: int
    blocks: int
    nc: int
    rope_args: tuple


@dataclass(frozen=True)
class Gather:
    """x given as rows of a table (the decode stack's first QKV reads the embedding itself):
    row m is table[fed[feed[m]]] where feed[m] >= 0, else table[ids[m]] (embed_fed's pick)."""

    table: Any  # f32 [V, K]
    ids: Any  # int32 [M]
    feed: Any = None  # int32 [M], or None: every row takes its own id
    fed: Any = None  # int32: the previous step's ids (with feed)


def _rows_of(x: Any, k: int) -> int:
    """M of x (an array, or a Gather), checked."""
    cp = cupy()
    if not isinstance(x, Gather):
        check_x(x, k)
        return x.shape[0]
    check_x(x.table, k)
    m = x.ids.shape[0] if x.ids.ndim == 1 else -1
    need(x.ids.dtype == cp.int32 and m >= 0, "linear_rows: gather ids must be int32 [M]")
    need((x.feed is None) == (x.fed is None), "linear_rows: gather feed and fed go together")
    need(x.feed is None or (x.feed.dtype == cp.int32 and x.feed.shape == (m,)
                             and x.fed.dtype == cp.int32),
          f"linear_rows: gather feed must be int32 [{m}] and fed int32")
    return m


def _form(what: str, x: Any, wd: DeviceWeight, out: Any, residual: Any, norm: Any, epi: int,
          rope: RopeStore | None) -> _Form:
    cp = cupy()
    n_w, k = wd.shape
    m = _rows_of(x, k)
    rope_args: tuple = (np.uint64(0),) * 7 + (cp.int32(0),) * 4
    if epi == EPI_STORE:
        n_out, blocks, nc = n_w, -(-n_w // 32), 1
        check_out(out, (m, n_out), "out")
        if residual is not None:
            check_out(residual, (m, n_out), "residual")
    elif epi == EPI_SWIGLU:
        need(n_w % 2 == 0 and residual is None, f"{what}: SwiGLU needs [2F, K], no residual")
        n_out, blocks, nc = n_w // 2, -(-(n_w // 2) // 32), 2
        check_out(out, (m, n_out), "out")
    else:
        need(rope is not None and residual is None, f"{what}: RoPE needs its RopeStore")
        heads = rope.n_heads + 2 * rope.n_kv
        need(n_w == heads * 64, f"{what}: QKV width {n_w} != {heads} heads x 64")
        n_out, blocks, nc = n_w, heads, 2
        check_out(out, (m, rope.n_heads * 64), "q_out")
        rope_args = (rope.positions, rope.pages, rope.slots, rope.cos, rope.sin, rope.k_pool,
                     rope.v_pool, cp.int32(rope.layer), cp.int32(rope.k_pool.shape[1]),
                     cp.int32(rope.n_heads), cp.int32(rope.n_kv))
    need(norm is None or norm.shape == (k,), f"{what}: norm weight must be [{k}]")
    return _Form(m, k, n_out, blocks, nc, rope_args)


def _head_args(x: Any, wd: DeviceWeight, out: Any, norm: Any, eps: float,
               residual: Any, bf16: bool = False) -> tuple:
    null = np.uint64(0)
    return (x, wd.wb if bf16 else wd.w, wd.scale if wd.scale is not None else out,
            norm if norm is not None else null, np.float32(eps),
            residual if residual is not None else null, out)


def _combine_args(x: Any, m: int, parts: Any, pscale: Any, x_out: Any, mt: int,
                  epi: int) -> tuple:
    """The combine (or gather) prologue's arguments (nulls when neither is asked), checked."""
    cp, null = cupy(), np.uint64(0)
    k = x.table.shape[1] if isinstance(x, Gather) else x.shape[1]
    prologue = parts is not None or isinstance(x, Gather)
    if prologue:
        need(mt == 1 and epi != EPI_STORE, "linear_rows: the combine and gather prologues "
              "are built for one row per CTA, SwiGLU or RoPE")
    if x_out is not None:
        need(prologue, "linear_rows: x_out needs parts or a gather")
        check_out(x_out, (m, k), "x_out")
    gather = (null,) * 3
    if isinstance(x, Gather):
        need(parts is None, "linear_rows: a gather adds no partials")
        gather = (x.ids, x.feed if x.feed is not None else null,
                  x.fed if x.fed is not None else null)
    out_arg = x_out if x_out is not None else null
    if parts is None:
        need(pscale is None, "linear_rows: pscale needs parts")
        return (null, cp.int32(0), null, out_arg) + gather
    need(parts.dtype == np.float32 and parts.ndim == 3 and parts.shape[1:] == (m, k)
          and 1 <= parts.shape[0] <= COMBINE_MAX_PARTS and parts.flags.c_contiguous,
          f"linear_rows: parts must be f32 [1..{COMBINE_MAX_PARTS}, {m}, {k}], got "
          f"{parts.dtype} {parts.shape}")
    need(pscale is None or pscale.shape == (k,), f"linear_rows: pscale must be [{k}]")
    return (parts, cp.int32(parts.shape[0]), pscale if pscale is not None else null,
            out_arg) + gather


def linear_rows(x: Any, wd: DeviceWeight, out: Any, *, residual: Any = None,
                norm: Any = None, eps: float = 0.0, epi: int = EPI_STORE,
                rope: RopeStore | None = None, mt: int | None = None, parts: Any = None,
                pscale: Any = None, x_out: Any = None, ctas_per_sm: int = CTAS_PER_SM,
                pdl: bool = False, mma: bool = False) -> Any:
    """The fused row kernel (cuda/linear_rows.cu): optional RMSNorm of x with ``norm``
    first, then the GEMM, then store (+ residual), SwiGLU, or RoPE + K/V store. ``mt``
    (1, 4 or 8 rows per CTA) overrides ``rows_mt`` for benchmarks; bits do not depend on it.
    ``parts`` [n, M, K] (one row per CTA; the decode stack): x is first x + those chunk
    partials of the previous GEMM, finished with its scales ``pscale``; ``x_out`` gets it.
    x may be a ``Gather`` (the same forms): its rows come from a table, ``x_out`` gets them.
    ``pdl``: launch with PDL (launch.py). ``mma``: the GEMM in the tensor-core order
    (linear_mma.cu's bits; the decode stack under CRUCIBLE_GEMM=mma): int8 weights, one
    row per CTA, the norm + RoPE form, K a multiple of 64."""
    cp = cupy()
    f = _form("linear_rows", x, wd, out, residual, norm, epi, rope)
    m, k = f.m, f.k
    need(k <= rows_max_k(m, epi), f"linear_rows: K={k} is above {rows_max_k(m, epi)}, the "
          f"most this form supports for {m} rows")
    if m == 0:
        return out
    mt = rows_mt(m) if mt is None else mt
    need(mt in (1, 4, 8), f"linear_rows: {mt} rows per CTA is not built (1, 4 or 8)")
    if mma:
        need(wd.dtype_name == "int8" and mt == 1 and epi == EPI_ROPE and norm is not None
             and k % 64 == 0, f"linear_rows: the mma order is built for the one-row int8 "
             f"norm + RoPE form with K % 64 == 0, not {wd.dtype_name} rows/CTA={mt} "
             f"epi={epi} norm={'yes' if norm is not None else 'no'} K={k}")
    combine = _combine_args(x, m, parts, pscale, x_out, mt, epi)
    chunks = -(-k // KC)
    row_groups = -(-m // mt)
    # The mma form's column blocks are half heads (linear_rows.cu: twice the CTAs).
    blocks = f.blocks * (2 if mma else 1)
    # Column blocks per CTA: one, unless that would make far more CTAs than the GPU runs at
    # once (the LM head); then each CTA stages and normalises x once for several blocks.
    groups = max(1, -(-blocks * row_groups // (ctas_per_sm * sm_count())))
    fn = fused_kernel(MMA_QKV if mma else
                      _rows_name(wd.dtype_name, mt, 0 if norm is None else 1, epi))
    smem = 4 * (mt * k + chunks * mt * f.nc * 32 + k)
    if mma:  # each warp's tiles of the codes as bf16, staged (linear_rows.cu)
        need(wd.wb is not None, "linear_rows: the mma order reads the codes as bf16 "
             "(upload_weight(..., bf16=True)); this weight has none")
        smem += 4096 * chunks
    ensure_dynamic_smem(fn, smem)
    x_ptr = x.table if isinstance(x, Gather) else x
    args = _head_args(x_ptr, wd, out, norm, eps, residual, mma) + (
        cp.int32(m), cp.int32(f.n_out), cp.int32(k), cp.int32(groups)) + f.rope_args + combine
    launch(fn, (-(-blocks // groups), row_groups), (32, max(chunks, 8)), args,
           shared_mem=smem, pdl=pdl)
    return out


def fuses(m: int, k: int, epi: int) -> bool:
    """Whether a fused form runs for m rows of K (else the caller composes primitives)."""
    return use_rows(m, k, epi)
