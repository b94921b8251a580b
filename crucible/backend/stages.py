"""The stage groups of a layer, composed from a backend's primitive operations.

A backend that does not fuse a group (the numpy backend always; the CuPy backend for
batches its row kernels do not cover) runs this composition. A fused kernel must give the
same bits as the composition, so which one ran never shows in the output.
"""

from __future__ import annotations

from typing import Any


def attn_in(be: Any, x: Any, i: int, meta: Any) -> Any:
    """RMSNorm -> QKV -> RoPE + K/V into the pages; returns Q [T, H*hd]."""
    return be.rope_and_store(be.linear(be.rmsnorm(x, f"l{i}.attn_norm"), f"l{i}.qkv"), i, meta)


def mlp_in(be: Any, x: Any, i: int) -> Any:
    """RMSNorm -> gate/up -> SwiGLU; returns [T, F]."""
    return be.swiglu(be.linear(be.rmsnorm(x, f"l{i}.ffn_norm"), f"l{i}.gate_up"))


def norm_linear(be: Any, x: Any, norm: str, weight: str) -> Any:
    """RMSNorm then a linear layer (the final norm and the LM head)."""
    return be.linear(be.rmsnorm(x, norm), weight)
