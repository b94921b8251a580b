"""The CuPy backend's fused stages under the tensor-core GEMM order (gemm "mma"):
RMSNorm -> GEMM (-> SwiGLU) as one launch of linear_mma_rows.cu where the shape takes the
rows kernel (decode sizes), up to FUSE_MAX_ROWS rows; past that, where the rows kernel still
runs, the SwiGLU epilogue stays in the GEMM after a separate RMSNorm, and where the
warpgroup-MMA tile kernel runs the gate/up GEMM (CRUCIBLE_WGMMA, large M) its SwiGLU
epilogue does (but at linear_wgmma.SWIGLU_SKIP_ROWS, where it measured slower). The fused
kernels write the bits the separate kernels write (rmsnorm_rows, linear_mma, swiglu_rows),
so which path a step takes never shows.
"""

from __future__ import annotations

from typing import Any

from crucible.kernels import linear_mma as lm
from crucible.kernels import linear_wgmma as lw


def norm_gemm(be: Any, x: Any, norm: str, weight: str, out: Any = None,
              swiglu: bool = False) -> Any | None:
    """``swiglu(norm(x) @ W)`` or ``norm(x) @ W`` in one launch; with ``swiglu`` past the
    prologue's rows, RMSNorm and then the GEMM with its SwiGLU epilogue (two launches where
    the separate stages take three). None where the stages stay separate (fma order, f32 or
    unsupported weights, sizes for the tile kernel). ``out``: where the result goes (else
    a new array)."""
    wd = be._linear[weight]
    if not be.mma or wd.dtype_name != "int8" or not lm.supports(*wd.shape):
        return None
    m, (n, k) = x.shape[0], wd.shape
    form, fused_norm = lm.fused_form(m, n, k, swiglu), True
    if form is None and swiglu:
        form, fused_norm = lm.fused_form(m, n, k, True, norm=False), False
    if form is None and swiglu and be.wgmma and (wf := lw.swiglu_route(m, wd)) is not None:
        out = be.new((m, n // 2)) if out is None else out
        return lw.linear_wgmma_swiglu(be.rmsnorm(x, norm), wd, out, form=wf, pdl=be.options.pdl)
    if form is None:
        return None
    out = be.new((m, n // 2 if swiglu else n)) if out is None else out
    if not fused_norm:
        return lm.linear_mma(be.rmsnorm(x, norm), wd, out, form=form, swiglu=True,
                             pdl=be.options.pdl)
    return lm.linear_mma(x, wd, out, form=form, norm=be._norms[norm], eps=be.cfg.rms_eps,
                         swiglu=swiglu, pdl=be.options.pdl)
