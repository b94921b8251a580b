"""The standalone row kernels (cuda/model_ops.cu): embedding, RMSNorm, RoPE + K/V store,
SwiGLU and the final-row gather, compiled once; ``rows_launch`` gives each row a block,
``flat_launch`` covers n elements with 256-thread blocks.
"""

from __future__ import annotations

import functools
from typing import Any

from crucible.kernels.source import cached_module

OPS = ("embed_rows", "embed_fed", "rmsnorm_rows", "rope_store", "swiglu_rows", "gather_rows")


@functools.cache
def kernel(name: str) -> Any:
    return cached_module("model_ops.cu", OPS).get_function(name)


def rows_launch(name: str, rows: int, args: tuple, threads: int = 256) -> None:
    if rows:
        kernel(name)((rows,), (threads,), args)


def flat_launch(name: str, n: int, args: tuple) -> None:
    if n:
        kernel(name)((-(-n // 256),), (256,), args)
