"""Compile the model kernels (cuda/linear.cu, linear_rows.cu, model_ops.cu) once; launch them.

Wrappers check dtypes, shapes and contiguity before every launch: a wrong array is a clear
ValueError on the host, never a silent out-of-bounds read on the device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.backend.cupy_launch import launch
from crucible.kernels.source import cuda_source_dir, read_cuda_source

ROWS_MAX_M = 128  # up to here the row kernels (linear_rows.cu); above, the tiled one
ROWS_MAX_K = 1536  # the row kernels give each 64-wide K chunk its own warp (<= 24 warps)
ROWS_MAX_K_PAIRED = 768  # one-row SwiGLU and RoPE forms are compiled for <= 12 warps
KC = 64
_OPS = ("embed_rows", "rmsnorm_rows", "rope_store", "swiglu_rows", "gather_rows")
# (prologue, epilogue) pairs the backend uses: plain/residual, norm + plain (LM head),
# norm + SwiGLU (gate/up), norm + RoPE + K/V store (QKV).
_ROWS_FORMS = ((0, 0), (1, 0), (1, 1), (1, 2))
EPI_STORE, EPI_SWIGLU, EPI_ROPE = 0, 1, 2


def _cupy() -> Any:
    import cupy

    return cupy


@functools.cache
def _module(name: str, expressions: tuple[str, ...]) -> Any:
    cp = _cupy()
    return cp.RawModule(code=read_cuda_source(name),
                        options=("-std=c++17", f"-I{cuda_source_dir()}"),
                        name_expressions=expressions)


def _ctype(wdtype: str) -> str:
    return "float" if wdtype == "float32" else "signed char"


def rows_mt(m: int) -> int:
    """Rows per block of the row kernels: never more than needed for tiny M; 4 up to 64
    rows (twice the CTAs of 8: 9-23% faster per GEMM at 64 rows on the H200,
    bench/gpu-kernels-h200.json), then 8."""
    return 1 if m == 1 else 4 if m <= 64 else 8


def _rows_name(wdtype: str, mt: int, pro: int, epi: int) -> str:
    return f"linear_rows<{_ctype(wdtype)}, {mt}, {pro}, {epi}>"


_ROWS_NAMES = tuple(_rows_name(d, mt, pro, epi) for d in ("float32", "int8")
                    for mt in (1, 4, 8) for pro, epi in _ROWS_FORMS)
_TILED_NAMES = tuple(f"linear_tiled<{_ctype(d)}>" for d in ("float32", "int8"))


@functools.cache
def kernel(name: str) -> Any:
    if name in _OPS:
        return _module("model_ops.cu", _OPS).get_function(name)
    if name in _ROWS_NAMES:
        return _module("linear_rows.cu", _ROWS_NAMES).get_function(name)
    return _module("linear.cu", _TILED_NAMES).get_function(name)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class DeviceWeight:
    """One linear weight on the device, in both layouts: W^T [K, N] for the tiled kernel
    (neighbouring threads read neighbouring columns) and W [N, K] for the row kernels (one
    thread reads a column's K chunk as contiguous vectors). f32, or int8 codes + scale[N]."""

    wt: Any
    w: Any
    scale: Any | None

    @property
    def shape(self) -> tuple[int, int]:  # (N, K), as the weight is written
        return tuple(self.w.shape)


def upload_weight(w: np.ndarray, scale: np.ndarray | None = None) -> DeviceWeight:
    """``w``: [N, K] f32 values, or int8 codes with ``scale`` [N]."""
    cp = _cupy()
    dt = np.int8 if scale is not None else np.float32
    w = np.ascontiguousarray(w, dtype=dt)
    return DeviceWeight(cp.asarray(np.ascontiguousarray(w.T)), cp.asarray(w),
                        None if scale is None else cp.asarray(scale.astype(np.float32)))


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


def _check_x(x: Any, k: int) -> None:
    cp = _cupy()
    _need(x.dtype == cp.float32 and x.ndim == 2 and x.flags.c_contiguous,
          "linear: x must be contiguous 2-D f32")
    _need(x.shape[1] == k, f"linear: x has K={x.shape[1]}, weight has K={k}")


def _check_out(out: Any, shape: tuple[int, int], what: str) -> None:
    cp = _cupy()
    _need(out.shape == shape and out.dtype == cp.float32 and out.flags.c_contiguous,
          f"linear: {what} must be contiguous f32 {shape}")


HEAD_TILED_FROM = 36  # rows; from here a wide weight (the LM head) runs on the tiled kernel
HEAD_WIDE = 8192  # output columns that make a weight "wide"


def linear(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
           tiled: bool = False) -> Any:
    """out[M, N] = x[M, K] @ W^T, plus ``residual[M, N]`` when given (added last).
    ``tiled``: the tiled kernel whatever M (same bits; faster for the LM head from
    HEAD_TILED_FROM rows, where the row kernels re-read its 28 MB once per 4 rows)."""
    n, k = wd.shape
    _check_x(x, k)
    m = x.shape[0]
    _check_out(out, (m, n), "out")
    if residual is not None:
        _check_out(residual, (m, n), "residual")
    if m == 0:
        return out
    if use_rows(m, k) and not tiled:
        return linear_rows(x, wd, out, residual=residual)
    return linear_tiled(x, wd, out, residual)


def linear_tiled(x: Any, wd: DeviceWeight, out: Any, residual: Any = None) -> Any:
    """The tiled kernel (cuda/linear.cu) over checked arguments (``linear`` checks them)."""
    cp = _cupy()
    n, k = wd.shape
    m = x.shape[0]
    scale_arg = wd.scale if wd.scale is not None else out  # unused by the f32 instantiation
    res_arg = residual if residual is not None else np.uint64(0)  # a null pointer
    args = (x, wd.wt, scale_arg, res_arg, out, cp.int32(m), cp.int32(n), cp.int32(k))
    kernel(f"linear_tiled<{_ctype(str(wd.wt.dtype))}>")((-(-n // 64), -(-m // 64)), (256,),
                                                         args)
    return out


def linear_rows(x: Any, wd: DeviceWeight, out: Any, *, residual: Any = None,
                norm: Any = None, eps: float = 0.0, epi: int = EPI_STORE,
                rope: RopeStore | None = None, mt: int | None = None) -> Any:
    """The fused row kernel (cuda/linear_rows.cu): optional RMSNorm of x with ``norm``
    first, then the GEMM, then store (+ residual), SwiGLU, or RoPE + K/V store. ``mt``
    (1, 4 or 8 rows per CTA) overrides ``rows_mt`` for benchmarks; bits do not depend on it."""
    from crucible.kernels.loader import ensure_dynamic_smem

    cp = _cupy()
    n_w, k = wd.shape
    _check_x(x, k)
    m = x.shape[0]
    _need(k <= rows_max_k(m, epi), f"linear_rows: K={k} is above {rows_max_k(m, epi)}, the "
          f"most this form supports for {m} rows")
    null = np.uint64(0)
    rope_args: tuple = (null,) * 7 + (cp.int32(0),) * 4
    if epi == EPI_STORE:
        n_out, grid_x, nc = n_w, -(-n_w // 32), 1
        _check_out(out, (m, n_out), "out")
        if residual is not None:
            _check_out(residual, (m, n_out), "residual")
    elif epi == EPI_SWIGLU:
        _need(n_w % 2 == 0 and residual is None, "linear_rows: SwiGLU needs [2F, K], no residual")
        n_out, grid_x, nc = n_w // 2, -(-(n_w // 2) // 32), 2
        _check_out(out, (m, n_out), "out")
    else:
        _need(rope is not None and residual is None, "linear_rows: RoPE needs its RopeStore")
        heads = rope.n_heads + 2 * rope.n_kv
        _need(n_w == heads * 64, f"linear_rows: QKV width {n_w} != {heads} heads x 64")
        n_out, grid_x, nc = n_w, heads, 2
        _check_out(out, (m, rope.n_heads * 64), "q_out")
        rope_args = (rope.positions, rope.pages, rope.slots, rope.cos, rope.sin, rope.k_pool,
                     rope.v_pool, cp.int32(rope.layer), cp.int32(rope.k_pool.shape[1]),
                     cp.int32(rope.n_heads), cp.int32(rope.n_kv))
    _need(norm is None or norm.shape == (k,), f"linear_rows: norm weight must be [{k}]")
    if m == 0:
        return out
    mt = rows_mt(m) if mt is None else mt
    _need(mt in (1, 4, 8), f"linear_rows: {mt} rows per CTA is not built (1, 4 or 8)")
    chunks = -(-k // KC)
    row_groups = -(-m // mt)
    # Column blocks per CTA: one, unless that would make far more CTAs than the GPU runs at
    # once (the LM head); then each CTA stages and normalises x once for several blocks.
    groups = max(1, -(-grid_x * row_groups // (4 * _sm_count())))
    fn = kernel(_rows_name(str(wd.w.dtype), mt, 0 if norm is None else 1, epi))
    smem = 4 * (mt * k + chunks * mt * nc * 32 + k)
    ensure_dynamic_smem(fn, smem)
    args = (x, wd.w, wd.scale if wd.scale is not None else out,
            norm if norm is not None else null, np.float32(eps),
            residual if residual is not None else null, out, cp.int32(m), cp.int32(n_out),
            cp.int32(k), cp.int32(groups)) + rope_args
    launch(fn, (-(-grid_x // groups), row_groups), (32, max(chunks, 8)), args, shared_mem=smem)
    return out


@functools.cache
def _sm_count() -> int:
    cp = _cupy()
    return int(cp.cuda.Device().attributes["MultiProcessorCount"])


def rows_launch(name: str, rows: int, args: tuple, threads: int = 256) -> None:
    if rows:
        kernel(name)((rows,), (threads,), args)


def flat_launch(name: str, n: int, args: tuple) -> None:
    if n:
        kernel(name)((-(-n // 256),), (256,), args)
