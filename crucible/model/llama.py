"""The Llama forward, written once against the backend protocol.

    embed -> per layer [RMSNorm -> QKV -> RoPE + K/V into pages -> attention -> O ->
    residual -> RMSNorm -> gate/up -> SwiGLU -> down -> residual] -> final rows ->
    final RMSNorm -> LM head

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
    x = be.embed(meta)  # [T, D]
    for i in range(cfg.n_layers):
        h = be.rmsnorm(x, f"l{i}.attn_norm")
        qkv = be.linear(h, f"l{i}.qkv")  # [T, (H + 2 KV) hd]
        q = be.rope_and_store(qkv, i, meta)  # [T, H hd]; K/V now in the pool
        a = be.attention(q, i, meta)  # [T, H hd]
        x = be.linear_add(a, f"l{i}.o", x)  # residual fused where the backend can
        h = be.rmsnorm(x, f"l{i}.ffn_norm")
        x = be.linear_add(be.swiglu(be.linear(h, f"l{i}.gate_up")), f"l{i}.down", x)
    rows = be.gather_rows(x, meta)  # [R, D]
    return be.linear(be.rmsnorm(rows, "final_norm"), "lm_head")
