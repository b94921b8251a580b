"""Compile the model kernels (cuda/linear.cu, model_ops.cu) once; launch them. The fused
decode-size GEMMs (linear_rows.cu) are in cupy_fused.py.

Wrappers check dtypes, shapes and contiguity before every launch: a wrong array is a clear
ValueError on the host, never a silent out-of-bounds read on the device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.kernels.source import compile_module

KC = 64
_OPS = ("embed_rows", "embed_fed", "rmsnorm_rows", "rope_store", "swiglu_rows", "gather_rows")


def _cupy() -> Any:
    import cupy

    return cupy


@functools.cache
def _module(name: str, expressions: tuple[str, ...]) -> Any:
    return compile_module(name, expressions)


def _ctype(wdtype: str) -> str:
    return "float" if wdtype == "float32" else "signed char"


_TILED_NAMES = tuple(f"linear_tiled<{_ctype(d)}>" for d in ("float32", "int8"))


@functools.cache
def kernel(name: str) -> Any:
    if name in _OPS:
        return _module("model_ops.cu", _OPS).get_function(name)
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
    from crucible.backend import cupy_chunks as cc
    from crucible.backend import cupy_fused as cf

    if not tiled and cc.use_chunks(m, n, k) and cc.aligned(x, wd.w, out, residual):
        return cc.linear_chunks(x, wd, out, residual)  # decode-size M: K chunks in parallel
    if cf.use_rows(m, k) and not tiled:
        return cf.linear_rows(x, wd, out, residual=residual)
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


def rows_launch(name: str, rows: int, args: tuple, threads: int = 256) -> None:
    if rows:
        kernel(name)((rows,), (threads,), args)


def flat_launch(name: str, n: int, args: tuple) -> None:
    if n:
        kernel(name)((-(-n // 256),), (256,), args)
