"""The tiled GEMM (cuda/linear.cu), compiled once, and ``linear``: the one entry that picks
the kernel by shape (the chunk kernel, linear_chunks.py, at decode-size M; the row kernels,
linear_rows.py, up to 128 rows; else the large-M kernel, linear_wide.py, where it measured
faster, or the tiled one, which stays the baseline). All keep linear.cu's canonical order,
so the pick never changes the bits. Arguments are checked before every launch.
"""

from __future__ import annotations

import functools
from typing import Any

from crucible.kernels import linear_chunks as cc
from crucible.kernels import linear_rows as cf
from crucible.kernels import linear_wide as lw
from crucible.kernels.device_weight import DeviceWeight, check_linear, ctype, gemm_args
from crucible.kernels.source import KernelModule, cached_module

_TILED_NAMES = tuple(f"linear_tiled<{ctype(d)}>" for d in ("float32", "int8"))


def module() -> KernelModule:
    return cached_module("linear.cu", _TILED_NAMES)


@functools.cache
def kernel(name: str) -> Any:
    return module().get_function(name)


HEAD_TILED_FROM = 36  # rows; from here a wide weight (the LM head) runs on the tiled kernel
HEAD_WIDE = 8192  # output columns that make a weight "wide"


def linear(x: Any, wd: DeviceWeight, out: Any, residual: Any = None, *,
           tiled: bool = False, pdl: bool = False) -> Any:
    """out[M, N] = x[M, K] @ W^T, plus ``residual[M, N]`` when given (added last).
    ``tiled``: the tiled kernel whatever M (same bits; faster for the LM head from
    HEAD_TILED_FROM rows, where the row kernels re-read its 28 MB once per 4 rows).
    ``pdl``: the chunk and row kernels launch with PDL (launch.py)."""
    m, n, k = check_linear(x, wd, out, residual)
    if m == 0:
        return out
    if not tiled and cc.use_chunks(m, n, k) and cc.aligned(x, wd.w, out, residual):
        return cc.linear_chunks(x, wd, out, residual, pdl=pdl)  # decode-size M: K chunks
    if cf.use_rows(m, k) and not tiled:
        return cf.linear_rows(x, wd, out, residual=residual, pdl=pdl)
    if lw.use_wide(m, n, k) and lw.aligned(x, wd.wt, wd.scale, out, residual):
        return lw.launch_wide(x, wd, out, residual)  # same bits as linear_tiled, faster
    return linear_tiled(x, wd, out, residual)


def linear_tiled(x: Any, wd: DeviceWeight, out: Any, residual: Any = None) -> Any:
    """The tiled kernel (cuda/linear.cu) over checked arguments (``linear`` checks them)."""
    n, m = wd.shape[0], x.shape[0]
    kernel(f"linear_tiled<{ctype(wd.dtype_name)}>")((-(-n // 64), -(-m // 64)), (256,),
                                                        gemm_args(x, wd, out, residual))
    return out
