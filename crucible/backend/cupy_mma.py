"""The CuPy backend's fused stages under the tensor-core GEMM order (gemm "mma"):
RMSNorm -> GEMM (-> SwiGLU) as one launch of linear_mma_rows.cu where the shape takes the
rows kernel (decode sizes), up to FUSE_MAX_ROWS rows; past that, where the rows kernel still
runs, gate/up keeps the SwiGLU epilogue after a separate RMSNorm. The fused kernel writes the
bits the separate kernels write (rmsnorm_rows, linear_mma, swiglu_rows), so which path a
step takes never shows.
"""

from __future__ import annotations

from typing import Any

from crucible.kernels import linear_mma as lm


def _mma_weight(be: Any, weight: str) -> Any | None:
    wd = be._linear[weight]
    return wd if be.mma and wd.dtype_name == "int8" and lm.supports(*wd.shape) else None


def norm_gemm(be: Any, x: Any, norm: str, weight: str, swiglu: bool = False) -> Any | None:
    """``swiglu(norm(x) @ W)`` or ``norm(x) @ W`` in one launch, or None where the stages
    stay separate (fma order, f32 or unsupported weights, sizes for the tile kernel)."""
    wd = _mma_weight(be, weight)
    form = None if wd is None else lm.fused_form(x.shape[0], wd.shape[0], wd.shape[1], swiglu)
    if form is None:
        return None
    out = be.new((x.shape[0], wd.shape[0] // 2 if swiglu else wd.shape[0]))
    return lm.linear_mma(x, wd, out, form=form, norm=be._norms[norm], eps=be.cfg.rms_eps,
                         swiglu=swiglu, pdl=be.options.pdl)


def norm_then_gemm_swiglu(be: Any, x: Any, norm: str, weight: str) -> Any | None:
    """RMSNorm, then ``swiglu(xn @ W)`` in one launch (the rows kernel's epilogue): two
    launches where the separate stages take three. None where no rows form takes it."""
    wd = _mma_weight(be, weight)
    form = None if wd is None else lm.fused_form(x.shape[0], wd.shape[0], wd.shape[1], True,
                                                 norm=False)
    if form is None:
        return None
    out = be.new((x.shape[0], wd.shape[0] // 2))
    return lm.linear_mma(be.rmsnorm(x, norm), wd, out, form=form, swiglu=True,
                         pdl=be.options.pdl)
