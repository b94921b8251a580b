"""The standalone row kernels (cuda/model_ops.cu): embedding, RMSNorm, RoPE + K/V store,
SwiGLU and the final-row gather, compiled once; ``rows_launch`` gives each row a block,
``flat_launch`` covers n elements with 256-thread blocks; ``rmsnorm_launch`` picks the
RMSNorm kernel (a warp a row where the row fits its registers, same bits). Each kernel waits for the
previous grid first (cuda/pdl.cuh), so ``pdl`` may be on for any of them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from crucible.kernels.launch import launch
from crucible.kernels.source import cached_module

OPS = ("embed_rows", "embed_fed", "rmsnorm_rows", "rmsnorm_warps", "rope_store",
       "swiglu_rows", "gather_rows")
# rmsnorm_warps' register row: lane l holds x[l + 32 i] for i < WARP_ROW_MAX (model_ops.cu).
WARP_ROW_MAX = 32


@functools.cache
def kernel(name: str) -> Any:
    return cached_module("model_ops.cu", OPS).get_function(name)


def rows_launch(name: str, rows: int, args: tuple, threads: int = 256, *,
                pdl: bool = False) -> None:
    if rows:
        launch(kernel(name), (rows,), (threads,), args, pdl=pdl)


def flat_launch(name: str, n: int, args: tuple, *, pdl: bool = False) -> None:
    if n:
        launch(kernel(name), (-(-n // 256),), (256,), args, pdl=pdl)


def rmsnorm_launch(x: Any, weight: Any, y: Any, eps: float, *, warps: bool = True,
                   pdl: bool = False) -> None:
    """y = RMSNorm(x) * weight over the rows of x (f32 [T, D]); ``warps``: a warp a row
    where D <= 32 * WARP_ROW_MAX, else (or off) a block a row. The bits are the same."""
    rows, d = x.shape
    if warps and d <= 32 * WARP_ROW_MAX:
        if rows:
            launch(kernel("rmsnorm_warps"), (-(-rows // 8),), (256,),
                   (x, weight, y, np.int32(rows), np.int32(d), np.float32(eps)), pdl=pdl)
    else:
        rows_launch("rmsnorm_rows", rows, (x, weight, y, np.int32(d), np.float32(eps)), pdl=pdl)
