"""The canonical batch-invariant GEMM on the CPU (compiled; see csrc/gemm.c).

Every output element is computed in the order cuda/linear.cu defines: K in 64-wide chunks,
fma chains from zero inside a chunk, chunk partials added in ascending order, then the int8
scale and the residual. So a row's bits never depend on the other rows, and equal the GPU
GEMM's for the same inputs.

Weights are packed once at load time (``pack_weight``) into panels of 16 output columns,
K-major, the layout the microkernel streams. int8 codes stay int8 (a quarter of the memory
traffic of f32 codes); their scale is applied after the sum, as on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crucible.backend import cpu_ext

PANEL = 16  # output columns per panel (CRU_NR in csrc/cpu.h)


@dataclass(frozen=True)
class PackedWeight:
    panels: np.ndarray  # [ceil(N/16), K, 16] f32 or int8; columns past N are zero
    scale: np.ndarray | None  # [N] f32 for int8 panels, else None
    n: int
    k: int

    def dense(self) -> np.ndarray:
        """The weight as f32 [N, K] (int8 codes as exact floats, unscaled): for checks."""
        p = self.panels.shape[0]
        return self.panels.transpose(0, 2, 1).reshape(p * PANEL, self.k)[: self.n].astype(
            np.float32)


def pack_weight(w: np.ndarray, scale: np.ndarray | None = None) -> PackedWeight:
    """[N, K] f32 weight, or int8 codes with their f32 scale[N] -> K-major panels."""
    if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"pack_weight: need a non-empty [N, K] matrix, got shape {w.shape}")
    n, k = w.shape
    if w.dtype == np.int8:
        if scale is None or scale.shape != (n,) or scale.dtype != np.float32:
            raise ValueError(f"pack_weight: int8 weights need a float32 scale of shape ({n},)")
        scale = np.ascontiguousarray(scale)
    elif w.dtype == np.float32:
        if scale is not None:
            raise ValueError("pack_weight: a scale goes with int8 weights only")
    else:
        raise TypeError(f"pack_weight: weights must be float32 or int8, got {w.dtype}")
    p = -(-n // PANEL)
    padded = np.zeros((p * PANEL, k), dtype=w.dtype)
    padded[:n] = w
    panels = np.ascontiguousarray(padded.reshape(p, PANEL, k).transpose(0, 2, 1))
    return PackedWeight(panels, scale, n, k)


def gemm(x: np.ndarray, weight: PackedWeight, residual: np.ndarray | None = None, *,
         threads: int = 1, scalar: bool = False) -> np.ndarray:
    """y[M, N] = x[M, K] @ W^T (times scale for int8), plus ``residual`` added last.

    ``scalar`` forces the portable kernel (the same bits as the AVX2 one, slower).
    """
    ext = cpu_ext.extension()
    if ext is None:
        raise RuntimeError("cpu_gemm: the compiled CPU kernels are not built")
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2:
        raise TypeError(f"cpu_gemm: x must be a 2-D float32 array, got "
                        f"{getattr(x, 'dtype', type(x))} {getattr(x, 'shape', '')}")
    m, k = x.shape
    if k != weight.k:
        raise ValueError(f"cpu_gemm: x has K={k}, the weight has K={weight.k}")
    if residual is not None:
        if not isinstance(residual, np.ndarray) or residual.dtype != np.float32 or \
                residual.shape != (m, weight.n):
            raise ValueError(f"cpu_gemm: residual must be float32 of shape {(m, weight.n)}, "
                             f"got {getattr(residual, 'dtype', None)} "
                             f"{getattr(residual, 'shape', None)}")
        residual = np.ascontiguousarray(residual)
    out = np.empty((m, weight.n), dtype=np.float32)
    if m:
        ext.gemm(np.ascontiguousarray(x), weight.panels, weight.scale, residual, out, m,
                 weight.n, k, threads, not scalar)
    return out
