"""Compiled CPU versions of the forward's non-GEMM stages (csrc/attention*.c, rows*.c).

Each keeps the numpy backend's promise: a row's (or a distribution's) result depends on its
own inputs only, whatever else is in the step. Their orders are fixed in the C sources'
headers; the scalar and AVX2 kernels give the same bits (``scalar=True`` forces the first).
These run only where the extension is built (``cpu_ext.extension()``).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from crucible.backend import cpu_ext

RMSNORM, SWIGLU, ROPE = 1, 2, 3  # op codes of csrc/cpu.h


def _ext() -> ModuleType:
    ext = cpu_ext.extension()
    if ext is None:
        raise RuntimeError("cpu_ops: the compiled CPU kernels are not built")
    return ext


def _rows_f32(x: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2:
        raise TypeError(f"{what}: need 2-D float32 rows, got {getattr(x, 'dtype', type(x))} "
                        f"{getattr(x, 'shape', '')}")
    return np.ascontiguousarray(x)


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, *, threads: int = 1,
            scalar: bool = False) -> np.ndarray:
    x = _rows_f32(x, "rmsnorm")
    rows, d = x.shape
    if weight.shape != (d,) or weight.dtype != np.float32:
        raise ValueError(f"rmsnorm: weight must be float32 of shape ({d},)")
    out = np.empty_like(x)
    _ext().rows(RMSNORM, x, d, 0, np.ascontiguousarray(weight), None, None, out, rows, d, 1,
                eps, threads, not scalar)
    return out


def swiglu(gate_up: np.ndarray, *, threads: int = 1, scalar: bool = False) -> np.ndarray:
    """[T, 2F] (gate | up) -> [T, F]: silu(gate) * up."""
    gate_up = _rows_f32(gate_up, "swiglu")
    rows, two_f = gate_up.shape
    if two_f % 2:
        raise ValueError(f"swiglu: need an even width (gate | up), got {two_f}")
    out = np.empty((rows, two_f // 2), dtype=np.float32)
    _ext().rows(SWIGLU, gate_up, two_f, 0, None, None, None, out, rows, two_f // 2, 1, 0.0,
                threads, not scalar)
    return out


def rope(src: np.ndarray, col0: int, heads: int, head_dim: int, cos: np.ndarray,
         sin: np.ndarray, *, threads: int = 1) -> np.ndarray:
    """Rotate ``heads`` heads starting at column ``col0`` of every row: [T, heads*hd].

    ``cos``/``sin`` are [T, hd/2]: the table rows of each row's absolute position.
    """
    src = _rows_f32(src, "rope")
    rows = src.shape[0]
    cos, sin = _rows_f32(cos, "rope cos"), _rows_f32(sin, "rope sin")
    if cos.shape != (rows, head_dim // 2) or sin.shape != cos.shape:
        raise ValueError(f"rope: cos/sin must be ({rows}, {head_dim // 2})")
    out = np.empty((rows, heads * head_dim), dtype=np.float32)
    _ext().rows(ROPE, src, src.shape[1], col0, None, cos, sin, out, rows, head_dim, heads, 0.0,
                threads, False)
    return out


def attention(q: np.ndarray, k_hist: np.ndarray, v_hist: np.ndarray, first: int,
              n_heads: int, n_kv: int, head_dim: int, *, threads: int = 1,
              scalar: bool = False) -> np.ndarray:
    """Causal attention of one segment's rows q [n, H*hd] over its history [L, KV*hd].

    Row r sits at absolute position ``first + r`` and sees history positions 0 .. first + r.
    """
    q = _rows_f32(q, "attention q")
    k_hist, v_hist = _rows_f32(k_hist, "attention k"), _rows_f32(v_hist, "attention v")
    n = q.shape[0]
    if q.shape[1] != n_heads * head_dim or k_hist.shape[1] != n_kv * head_dim or \
            v_hist.shape != k_hist.shape or first + n > k_hist.shape[0]:
        raise ValueError(f"attention: shapes q {q.shape}, k {k_hist.shape}, v {v_hist.shape} "
                         f"do not fit H={n_heads}, KV={n_kv}, hd={head_dim}, first={first}")
    out = np.empty_like(q)
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    _ext().attention(q, k_hist, v_hist, out, n, k_hist.shape[0], n_heads, n_kv, head_dim,
                     first, scale, threads, not scalar)
    return out


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"paged_attention: {message}")


def _check_array(a: np.ndarray, name: str, dtype: type, ndim: int) -> None:
    if isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim and \
            a.flags.c_contiguous:
        return  # the messages below cost more than the checks: build them only on failure
    _check(isinstance(a, np.ndarray), f"{name} must be a numpy array, got {type(a).__name__}")
    _check(a.dtype == dtype, f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    _check(a.ndim == ndim, f"{name} must be {ndim}-D, got shape {a.shape}")
    _check(False, f"{name} must be C-contiguous")


def paged_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, layer: int,
                    segments: np.ndarray, page_tables: np.ndarray, n_heads: int, n_kv: int,
                    head_dim: int, *, threads: int = 1, scalar: bool = False) -> np.ndarray:
    """Causal attention of a whole step's rows q [T, H*hd] at ``layer``, in one call.

    ``segments`` [S, 4] int32 (packed_start, chunk_len, absolute_start, table_index) tile
    the rows in order; row ``packed_start + i`` sits at ``absolute_start + i`` and sees
    history positions 0 .. itself, position p at slot ``p & 15`` of pool page
    ``page_tables[table_index, p >> 4]`` (pools f32 [num_pages, n_layers, 16, KV*hd]). Each
    (row, head) is computed as ``attention`` computes it over the gathered history: the
    same bits.
    """
    _check_array(q, "q", np.float32, 2)
    for pool, name in ((k_pool, "k_pool"), (v_pool, "v_pool")):
        _check_array(pool, name, np.float32, 4)
    _check_array(segments, "segments", np.int32, 2)
    _check_array(page_tables, "page_tables", np.int32, 2)
    _check(n_heads > 0 and n_kv > 0 and n_heads % n_kv == 0,
           f"n_heads {n_heads} must be a positive multiple of n_kv {n_kv}")
    _check(head_dim >= 8 and head_dim % 8 == 0, f"head_dim {head_dim} must be a multiple of 8")
    _check(q.shape[1] == n_heads * head_dim, f"q width {q.shape[1]} != {n_heads}*{head_dim}")
    kv_dim = n_kv * head_dim
    _check(k_pool.shape == v_pool.shape, f"k_pool {k_pool.shape} and v_pool {v_pool.shape} differ")
    num_pages, n_layers = k_pool.shape[:2]
    _check(num_pages > 0 and k_pool.shape[2:] == (16, kv_dim),
           f"pool shape {k_pool.shape} must be [pages>0, layers, 16, {kv_dim}]")
    _check(0 <= layer < n_layers, f"layer {layer} outside 0..{n_layers - 1}")
    _check(segments.shape[1] == 4, f"segments must be [S, 4], got {segments.shape}")
    rows = q.shape[0]
    starts, lens, firsts, tables = segments.T
    ends = np.cumsum(lens, dtype=np.int64)
    _check(bool((lens >= 0).all() and (firsts >= 0).all()),
           "segments need chunk_len >= 0 and absolute_start >= 0")
    _check(bool((starts == ends - lens).all()) and (ends[-1] if len(ends) else 0) == rows,
           f"segments (packed_start, chunk_len) must tile rows 0..{rows} in order")
    n_tables, width = page_tables.shape
    _check(bool(((tables >= 0) & (tables < n_tables)).all()),
           f"a segment's table_index is outside 0..{n_tables - 1}")
    hist = firsts.astype(np.int64) + lens  # exclusive end of each segment's history
    _check(bool((hist <= 16 * width).all()),
           f"a segment's history needs more than the tables' {width} pages")
    if rows == 0:
        return np.empty_like(q)
    if page_tables.size and not (page_tables.min() >= 0 and page_tables.max() < num_pages):
        used = np.arange(width)[None, :] < ((hist + 15) // 16)[:, None]  # [S, P] pages read
        ids = page_tables[tables][used]  # entries past a table's length may hold anything
        _check(bool(((ids >= 0) & (ids < num_pages)).all()),
               f"a page id read by a segment is outside the pool's 0..{num_pages - 1}")
    out = np.empty_like(q)
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))
    _ext().paged_attention(q, k_pool, v_pool, out, layer, segments, page_tables, rows,
                           num_pages, n_layers, segments.shape[0], n_tables, width, n_heads,
                           n_kv, head_dim, scale, threads, not scalar)
    return out
