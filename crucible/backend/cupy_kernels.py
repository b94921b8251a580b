"""Compile the model kernels (cuda/linear.cu, cuda/model_ops.cu) once and launch them.

Wrappers check dtypes, shapes and contiguity before every launch: a wrong array is a clear
ValueError on the host, never a silent out-of-bounds read on the device.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from crucible.kernels.source import read_cuda_source

SKINNY_ROWS = 4  # rows per skinny block (MT in linear.cu)
SKINNY_MAX_M = 128  # up to here the skinny kernel (more blocks); above, the tiled one (same bits)
KC = 64
_OPS = ("embed_rows", "rmsnorm_rows", "rope_store", "swiglu_rows", "gather_rows")


def _cupy() -> Any:
    import cupy

    return cupy


@functools.cache
def _module(name: str, expressions: tuple[str, ...]) -> Any:
    cp = _cupy()
    return cp.RawModule(code=read_cuda_source(name), options=("-std=c++17",),
                        name_expressions=expressions)


def _linear_names(wdtype: str) -> tuple[str, str]:
    t = "float" if wdtype == "float32" else "signed char"
    return f"linear_skinny<{t}, {SKINNY_ROWS}>", f"linear_tiled<{t}>"


@functools.cache
def kernel(name: str) -> Any:
    if name in _OPS:
        return _module("model_ops.cu", _OPS).get_function(name)
    names = _linear_names("float32") + _linear_names("int8")
    return _module("linear.cu", names).get_function(name)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def linear(x: Any, wt: Any, scale: Any, out: Any, residual: Any = None) -> Any:
    """out[M, N] = x[M, K] @ W (wt = W^T [K, N], f32 or int8 with f32 scale[N]), plus
    ``residual[M, N]`` when given (added last, as a separate add would)."""
    cp = _cupy()
    m, k = x.shape
    k2, n = wt.shape
    _need(x.dtype == cp.float32 and x.flags.c_contiguous, "linear: x must be contiguous f32")
    _need(k == k2, f"linear: x has K={k}, weight has K={k2}")
    _need(out.shape == (m, n) and out.dtype == cp.float32 and out.flags.c_contiguous,
          f"linear: out must be contiguous f32 {(m, n)}")
    _need(wt.dtype in (cp.float32, cp.int8), f"linear: weight dtype {wt.dtype}")
    _need(wt.dtype == cp.float32 or (scale is not None and scale.shape == (n,)),
          "linear: int8 weights need scale[N]")
    if m == 0:
        return out
    _need(residual is None or (residual.shape == (m, n) and residual.dtype == cp.float32
                                and residual.flags.c_contiguous),
          f"linear: residual must be contiguous f32 {(m, n)}")
    skinny, tiled = _linear_names(str(wt.dtype))
    scale_arg = scale if scale is not None else out  # unused by the f32 instantiation
    res_arg = residual if residual is not None else np.uint64(0)  # a null pointer
    args = (x, wt, scale_arg, res_arg, out, cp.int32(m), cp.int32(n), cp.int32(k))
    if m <= SKINNY_MAX_M:
        chunks = -(-k // KC)
        _need(chunks <= 32, f"linear: K={k} is above the skinny kernel's 2048")
        smem = 4 * (SKINNY_ROWS * k + chunks * SKINNY_ROWS * 32)
        kernel(skinny)((-(-n // 32), -(-m // SKINNY_ROWS)), (32, chunks), args, shared_mem=smem)
    else:
        kernel(tiled)((-(-n // 64), -(-m // 64)), (256,), args)
    return out


def rows_launch(name: str, rows: int, args: tuple, threads: int = 256) -> None:
    if rows:
        kernel(name)((rows,), (threads,), args)


def flat_launch(name: str, n: int, args: tuple) -> None:
    if n:
        kernel(name)((-(-n // 256),), (256,), args)
