"""The Llama forward, written once against the backend protocol.

    embed -> per layer [RMSNorm -> QKV -> RoPE + K/V into pages -> attention -> O ->
    residual -> RMSNorm -> gate/up -> SwiGLU -> down -> residual] -> final rows ->
    final RMSNorm -> LM head

Three stage groups (attn_in, mlp_in, norm_linear) are backend operations, fused where the
backend can (crucible/backend/stages.py composes them otherwise).

Shapes: activations are packed rows [T, features]; only the final rows reach the LM head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crucible.backend.protocol import Backend
from crucible.model.config import ModelConfig
from crucible.step.batch import PackedBatch


def forward(cfg: ModelConfig, be: Backend, batch: PackedBatch) -> np.ndarray:
    """Run one packed step eagerly; return f32 logits [R, vocab] on the host."""
    return be.to_host(forward_meta(cfg, be, be.prepare(batch)))


def forward_meta(cfg: ModelConfig, be: Backend, meta: Any) -> Any:
    """The forward over already-uploaded step metadata; logits stay on the backend."""
    h = be.decode_stack(meta)  # the backend's own embedding and layers, or None
    if h is None:
        h = layers(cfg, be, be.embed(meta), meta)  # [T, D]
    rows = be.gather_rows(h, meta)  # [R, D]
    return be.norm_linear(rows, "final_norm", "lm_head")


def layers(cfg: ModelConfig, be: Backend, x: Any, meta: Any) -> Any:
    """Every layer, one stage (or fused stage group) at a time; returns the residual."""
    for i in range(cfg.n_layers):
        q = be.attn_in(x, i, meta)  # [T, H hd]; K/V now in the pool
        a = be.attention(q, i, meta)  # [T, H hd]
        x = be.linear_add(a, f"l{i}.o", x)  # residual fused where the backend can
        x = be.linear_add(be.mlp_in(x, i), f"l{i}.down", x)
    return x
