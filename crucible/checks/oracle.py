"""A float64 numpy oracle for paged causal attention (host arrays, any machine).

It reads the pool exactly as the kernels do (page table translation per position) but
does every dot product, softmax and weighted sum in float64, so it measures how far any
f32 variant is from the mathematical answer, independent of reduction order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

HEAD_DIM = 64
PAGE = 16


def gather_history(pool: np.ndarray, layer: int, table: np.ndarray, length: int) -> np.ndarray:
    """Positions 0..length-1 of one request as float64 ``[length, kv_dim]``."""
    pos = np.arange(length)
    pages = table[pos // PAGE]
    return pool[pages, layer, pos % PAGE].astype(np.float64)


def segment_of_row(segments: np.ndarray, row: int) -> int:
    for i, (start, length, _, _) in enumerate(segments):
        if start <= row < start + length:
            return i
    raise ValueError(f"row {row} belongs to no segment")


def oracle_rows(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, layer: int,
                segments: np.ndarray, page_tables: np.ndarray, rows: Sequence[int],
                n_heads: int, n_kv_heads: int) -> np.ndarray:
    """Attention output of the given packed rows, float64 ``[len(rows), n_heads*64]``."""
    group = n_heads // n_kv_heads
    result = np.empty((len(rows), n_heads * HEAD_DIM), dtype=np.float64)
    for out_i, row in enumerate(rows):
        start, _, absolute, table_index = segments[segment_of_row(segments, row)]
        length = int(absolute) + (row - int(start)) + 1
        table = page_tables[table_index]
        keys = gather_history(k_pool, layer, table, length)
        values = gather_history(v_pool, layer, table, length)
        for h in range(n_heads):
            cols = slice((h // group) * HEAD_DIM, (h // group + 1) * HEAD_DIM)
            qh = q[row, h * HEAD_DIM:(h + 1) * HEAD_DIM].astype(np.float64)
            scores = keys[:, cols] @ qh * 0.125
            weights = np.exp(scores - scores.max())
            result[out_i, h * HEAD_DIM:(h + 1) * HEAD_DIM] = (
                weights @ values[:, cols] / weights.sum())
    return result
