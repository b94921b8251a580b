"""What every GEMM wrapper (linear.py, linear_rows.py, linear_chunks.py, decode_stack.py)
shares: a linear weight on the device in both layouts (``DeviceWeight``, ``upload_weight``),
the argument checks they run before a launch (a wrong array is a clear ValueError on the
host, never a silent out-of-bounds read on the device), the weight's C type in kernel names,
the K chunk width and the epilogue ids of the fused kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

KC = 64  # K chunk width of every GEMM's canonical order (cuda/linear.cu)
EPI_STORE, EPI_SWIGLU, EPI_ROPE = 0, 1, 2  # epilogues of linear_rows.cu and linear_chunks.cu


def cupy() -> Any:
    import cupy

    return cupy


def ctype(wdtype: str) -> str:
    """The C type a weight dtype instantiates the kernels with."""
    return "float" if wdtype == "float32" else "signed char"


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class DeviceWeight:
    """One linear weight on the device, in both layouts: W^T [K, N] for the tiled kernel
    (neighbouring threads read neighbouring columns) and W [N, K] for the row kernels (one
    thread reads a column's K chunk as contiguous vectors). f32, or int8 codes + scale[N]."""

    wt: Any
    w: Any
    scale: Any | None
    wb: Any | None = None  # int8 only, on request: the codes as bf16 [N, K] (uint16)
    wg: Any | None = None  # int8 only, on request: the same as wgmma reads them (codes_wgmma)

    @property
    def shape(self) -> tuple[int, int]:  # (N, K), as the weight is written
        return tuple(self.w.shape)

    @functools.cached_property
    def dtype_name(self) -> str:
        """'float32' or 'int8', computed once: numpy's dtype names are slow to build, and
        every launch of every layer names its kernel by it."""
        return str(self.w.dtype)


def upload_weight(w: np.ndarray, scale: np.ndarray | None = None,
                  bf16: bool = False, wgmma: bool = False) -> DeviceWeight:
    """``w``: [N, K] f32 values, or int8 codes with ``scale`` [N]. ``bf16`` (int8 only): also
    the codes as bf16 [N, K] (each exact), for linear_mma.cu's BW forms: twice the codes'
    bytes, which the tensor-core tile GEMM loads instead of converting codes. ``wgmma``
    (int8, a shape linear_wgmma.cu takes: N % 8 == 0, K % 64 == 0): the same bf16 codes in
    the order linear_wgmma.cu reads them (``codes_wgmma``), twice the codes' bytes again.
    The weight goes up once, as given; its other layouts are made on the device (the same
    exact conversions and copies: on the host they were ~1 s of every start, H100 profile
    bench/warm-start-profile-h100.txt)."""
    cp = cupy()
    dt = np.int8 if scale is not None else np.float32
    dw = cp.asarray(np.ascontiguousarray(w, dtype=dt))
    n, k = dw.shape
    int8 = scale is not None
    wgmma = wgmma and int8 and n % 8 == 0 and k % 64 == 0
    bits = codes_bf16(dw) if int8 and (bf16 or wgmma) else None  # made once for both
    wb = bits if bf16 else None  # bits is None unless int8
    wg = _wgmma_image(bits, cp) if wgmma else None
    return DeviceWeight(cp.ascontiguousarray(dw.T), dw,
                        None if scale is None else cp.asarray(scale.astype(np.float32)), wb, wg)


def codes_bf16(codes: Any) -> Any:
    """int8 codes as bf16 bit patterns (uint16): an int8 code's bf16 is its f32's top half,
    exactly. A numpy or a CuPy array, answered in kind."""
    return (codes.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def codes_wgmma(codes: Any, xp: Any = np) -> Any:
    """int8 codes [N, K] (N % 8 == 0, K % 64 == 0) as bf16 bits in the shared-memory image
    cuda/linear_wgmma.cu copies 16 bytes at a time, [N/8][K/64][step j][core kc][column
    r][slot p]: element code[8 nc + r][64 c + 16 (p // 2) + 4 j + p % 2 + 2 kc], the k
    that linear_mma.cu's order puts in slot 8 kc + p of step j (flat, uint16). ``xp``:
    numpy, or cupy for codes on the device."""
    return _wgmma_image(codes_bf16(codes), xp)


def _wgmma_image(bits: Any, xp: Any) -> Any:
    """``codes_wgmma`` from the codes' bf16 bits [N, K] (``codes_bf16``)."""
    n, k = bits.shape
    b = bits.reshape(n // 8, 8, k // 64, 4, 4, 2, 2)  # [nc][r][c][t][j][kc][p%2]
    return xp.ascontiguousarray(b.transpose(0, 2, 4, 5, 1, 3, 6)).reshape(-1)


def check_x(x: Any, k: int) -> None:
    # Messages are built only on failure: these checks run before every GEMM launch.
    if not (x.dtype == np.float32 and x.ndim == 2 and x.flags.c_contiguous):
        raise ValueError("linear: x must be contiguous 2-D f32")
    if x.shape[1] != k:
        raise ValueError(f"linear: x has K={x.shape[1]}, weight has K={k}")


def check_out(out: Any, shape: tuple[int, int], what: str) -> None:
    if not (out.shape == shape and out.dtype == np.float32 and out.flags.c_contiguous):
        raise ValueError(f"linear: {what} must be contiguous f32 {shape}")


def check_linear(x: Any, wd: "DeviceWeight", out: Any, residual: Any) -> tuple[int, int, int]:
    """A GEMM's activation, output and residual against its weight; (M, N, K)."""
    n, k = wd.shape
    check_x(x, k)
    m = x.shape[0]
    check_out(out, (m, n), "out")
    if residual is not None:
        check_out(residual, (m, n), "residual")
    return m, n, k


def gemm_args(x: Any, wd: "DeviceWeight", out: Any, residual: Any) -> tuple:
    """The [K, N]-weight GEMMs' arguments (linear_tiled, linear_wide): x, wt, scale,
    residual, out, M, N, K; a missing scale or residual goes as a pointer never read."""
    cp = cupy()
    n, k = wd.shape
    scale = wd.scale if wd.scale is not None else out  # unused by the f32 instantiation
    res = residual if residual is not None else np.uint64(0)  # a null pointer
    return (x, wd.wt, scale, res, out, cp.int32(x.shape[0]), cp.int32(n), cp.int32(k))
