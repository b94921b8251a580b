"""The Llama forward, written once against the backend protocol.

    embed -> per layer [RMSNorm -> QKV -> RoPE + K/V into pages -> attention -> O ->
    residual -> RMSNorm -> gate/up -> SwiGLU -> down -> residual] -> final rows ->
    final RMSNorm -> LM head

Three stage groups (attn_in, mlp_in, norm_linear) may be fused by a backend.

Shapes: activations are packed rows [T, features]; only the final rows reach the LM head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crucible.backend.protocol import Backend
from crucible.engine.batch import PackedBatch
from crucible.model.config import ModelConfig


def forward(cfg: ModelConfig, be: Backend, batch: PackedBatch) -> np.ndarray:
    """Run one packed step; return f32 logits [len(batch.final_rows), vocab] on the host."""
    return be.to_host(forward_meta(cfg, be, be.prepare(batch)))


def forward_meta(cfg: ModelConfig, be: Backend, meta: Any) -> Any:
    """The forward over already-uploaded step metadata; logits stay on the backend."""
    stack = getattr(be, "decode_stack", None)  # a backend's own embedding and layers
    h = stack(meta) if stack is not None else None  # None: not for this step
    if h is None:
        h = layers(cfg, be, be.embed(meta), meta)  # [T, D]
    rows = be.gather_rows(h, meta)  # [R, D]
    return norm_linear(be, rows, "final_norm", "lm_head")


def layers(cfg: ModelConfig, be: Backend, x: Any, meta: Any) -> Any:
    """Every layer, one stage (or fused stage group) at a time; returns the residual."""
    for i in range(cfg.n_layers):
        q = attn_in(be, x, i, meta)  # [T, H hd]; K/V now in the pool
        a = be.attention(q, i, meta)  # [T, H hd]
        x = be.linear_add(a, f"l{i}.o", x)  # residual fused where the backend can
        x = be.linear_add(mlp_in(be, x, i), f"l{i}.down", x)
    return x


# Stage groups a backend may fuse into one kernel (the CuPy backend does for small batches).
# A backend without the method gets the composition of primitives below; a fused version
# must give the same bits as the composition.
def attn_in(be: Backend, x: Any, i: int, meta: Any) -> Any:
    fused = getattr(be, "attn_in", None)
    return fused(x, i, meta) if fused is not None else compose_attn_in(be, x, i, meta)


def mlp_in(be: Backend, x: Any, i: int) -> Any:
    fused = getattr(be, "mlp_in", None)
    return fused(x, i) if fused is not None else compose_mlp_in(be, x, i)


def norm_linear(be: Backend, x: Any, norm: str, weight: str) -> Any:
    fused = getattr(be, "norm_linear", None)
    return fused(x, norm, weight) if fused is not None else be.linear(be.rmsnorm(x, norm), weight)


def compose_attn_in(be: Backend, x: Any, i: int, meta: Any) -> Any:
    """RMSNorm -> QKV -> RoPE + K/V into the pages; returns Q."""
    return be.rope_and_store(be.linear(be.rmsnorm(x, f"l{i}.attn_norm"), f"l{i}.qkv"), i, meta)


def compose_mlp_in(be: Backend, x: Any, i: int) -> Any:
    """RMSNorm -> gate/up -> SwiGLU."""
    return be.swiglu(be.linear(be.rmsnorm(x, f"l{i}.ffn_norm"), f"l{i}.gate_up"))
