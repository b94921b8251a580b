"""The standalone row kernels (cuda/model_ops.cu): embedding, RMSNorm, RoPE + K/V store,
SwiGLU and the final-row gather, compiled once; ``rows_launch`` gives each row a block,
``flat_launch`` covers n elements with 256-thread blocks. Each kernel waits for the
previous grid first (cuda/pdl.cuh), so ``pdl`` may be on for any of them.
"""

from __future__ import annotations

import functools
from typing import Any

from crucible.kernels.launch import launch
from crucible.kernels.source import KernelModule, cached_module

OPS = ("embed_rows", "embed_fed", "rmsnorm_rows", "rope_store", "swiglu_rows", "gather_rows")


def module() -> KernelModule:
    return cached_module("model_ops.cu", OPS)


@functools.cache
def kernel(name: str) -> Any:
    return module().get_function(name)


def rows_launch(name: str, rows: int, args: tuple, threads: int = 256, *,
                pdl: bool = False) -> None:
    if rows:
        launch(kernel(name), (rows,), (threads,), args, pdl=pdl)


def flat_launch(name: str, n: int, args: tuple, *, pdl: bool = False) -> None:
    if n:
        launch(kernel(name), (-(-n // 256),), (256,), args, pdl=pdl)
