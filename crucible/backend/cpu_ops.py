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
