"""Paged causal attention on numpy with a batch-invariant reduction order.

For one segment and all KV heads at once. History is read only through the page table:
K/V of positions ``0 .. end`` are gathered page by page into blocks of 64 positions. Each
(query row, query head) pair is one *distribution* (a column):

- scores: per 64-position block, ``K_block[64, hd] @ Q_cols[hd, tile]`` (fixed-shape BLAS
  tiles, see ``numpy_gemm``), times ``1/sqrt(hd)``;
- max: exact whatever the order; ``exp`` elementwise in f32;
- denominator: a running (cumulative) sum in ascending history order, read at the row's
  own causal end, so positions after it, and the padded width, never enter it;
- PV: per block ``V_block^T[hd, 64] @ E_cols[64, tile]``, blocks added in ascending order
  (a block past the row's end contributes exact zeros), then times ``1 / denominator``.

So a distribution's result depends only on its query, its position and its history, not
on the other rows of the step, the chunking of the prompt, or where the pages live.

This is the path without the compiled CPU kernels. With them built, the backend calls
``cpu_ops.paged_attention`` instead: one call per layer for the whole step, each row read
from the pool through its page table in its own fixed order (csrc/attention.c): same
promise, different bits, much faster.
"""

from __future__ import annotations

import numpy as np

from crucible.backend.numpy_gemm import calibrate_tile, tile_columns

BLOCK = 64
ROW_CHUNK = 256  # bounds the score buffer; rows are independent so chunking is invisible


def gather_history(pool: np.ndarray, layer: int, table: np.ndarray, length: int) -> np.ndarray:
    """K or V of positions [0, length) -> [ceil(length/64)*64, kv_dim], zero past length."""
    n_pages = -(-length // 16)
    hist = pool[table[:n_pages], layer].reshape(n_pages * 16, pool.shape[-1])
    padded = np.zeros((-(-length // BLOCK) * BLOCK, pool.shape[-1]), dtype=np.float32)
    padded[:length] = hist[:length]
    return padded


def _attend_rows(q: np.ndarray, k_hist: np.ndarray, v_hist: np.ndarray, ends: np.ndarray,
                 n_kv: int, hd: int) -> np.ndarray:
    """q [n, H*hd] for rows whose causal ends (inclusive) are ``ends`` -> [n, H*hd]."""
    n = q.shape[0]
    g = q.shape[1] // (n_kv * hd)
    nb = k_hist.shape[0] // BLOCK
    ncol = n * g
    # Columns c = row * G + head-in-group, one set per KV head.
    cols = q.reshape(n, n_kv, g, hd).transpose(1, 0, 2, 3).reshape(n_kv, ncol, hd)
    kb = k_hist.reshape(nb, BLOCK, n_kv, hd).transpose(2, 0, 1, 3)  # [KV, nb, 64, hd]
    vb = np.ascontiguousarray(v_hist.reshape(nb, BLOCK, n_kv, hd).transpose(2, 0, 3, 1))
    t1 = calibrate_tile(BLOCK, hd)
    qt = np.stack([tile_columns(cols[h], t1) for h in range(n_kv)])  # [KV, nct, hd, t1]
    s = np.matmul(np.ascontiguousarray(kb)[:, :, None], qt[:, None])  # [KV, nb, nct, 64, t1]
    nct = qt.shape[1]
    s = s.transpose(0, 2, 4, 1, 3).reshape(n_kv, nct * t1, nb * BLOCK)[:, :ncol]
    s = s * np.float32(1.0 / np.sqrt(hd))
    col_end = np.repeat(ends, g)  # [ncol]
    future = np.arange(nb * BLOCK)[None, :] > col_end[:, None]
    s = np.where(future[None], np.float32(-np.inf), s)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    denom = np.take_along_axis(np.cumsum(e, axis=-1), np.broadcast_to(col_end[None, :, None],
                                                                       (n_kv, ncol, 1)), axis=-1)
    recip = np.float32(1.0) / denom  # [KV, ncol, 1]
    t2 = calibrate_tile(hd, BLOCK)
    nct2 = -(-ncol // t2)
    ep = np.zeros((n_kv, nct2 * t2, nb * BLOCK), dtype=np.float32)
    ep[:, :ncol] = e
    et = np.ascontiguousarray(ep.reshape(n_kv, nct2, t2, nb, BLOCK).transpose(0, 3, 1, 4, 2))
    pv = np.matmul(vb[:, :, None], et)  # [KV, nb, nct2, hd, t2]
    acc = pv[:, 0]
    for b in range(1, nb):  # ascending history blocks, one f32 add each
        acc = acc + pv[:, b]
    out = acc.transpose(0, 1, 3, 2).reshape(n_kv, nct2 * t2, hd)[:, :ncol] * recip
    return np.ascontiguousarray(out.reshape(n_kv, n, g, hd).transpose(1, 0, 2, 3)).reshape(n, -1)


def paged_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, layer: int,
                    segments: np.ndarray, page_tables: np.ndarray, n_kv: int, hd: int) -> np.ndarray:
    out = np.empty_like(q)
    for start, length, abs_start, table_index in segments.tolist():
        table = page_tables[table_index]
        for r0 in range(0, length, ROW_CHUNK):
            r1 = min(length, r0 + ROW_CHUNK)
            end = abs_start + r1  # exclusive end of the history this chunk can see
            k_hist = gather_history(k_pool, layer, table, end)
            v_hist = gather_history(v_pool, layer, table, end)
            ends = np.arange(abs_start + r0, abs_start + r1)
            out[start + r0 : start + r1] = _attend_rows(q[start + r0 : start + r1], k_hist,
                                                        v_hist, ends, n_kv, hd)
    return out

