"""RoPE inside a decode step's attention (the CuPy backend's attn_in -> attention hand-off).

In a decode step whose attention runs a KV head's whole query group a CTA, that CTA owns
its KV head of its row, so it can rotate the row's Q and K heads and store K/V itself
(attn_decode's RoPE-in form, cuda/attention_decode.cu) instead of a rope_store launch
before it: one launch a layer fewer in the steps that dominate serving. attn_in then returns
the raw QKV wrapped in ``RawQKV``, which only this backend's attention takes; the K/V in the
pool and the attention output are rope_store's and paged_attention's bits
(tests/test_gpu_rope_in.py; on the host, tests/cuda_host/decode_attn_driver.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crucible.backend import cupy_mma, stages
from crucible.kernels import attention as ka
from crucible.kernels.variants import LaunchPlan


@dataclass(frozen=True)
class RawQKV:
    """A decode step's QKV before RoPE [T, (H + 2 KV) * 64], and the launch that takes it."""

    qkv: Any
    plan: LaunchPlan


def plan(be: Any, meta: Any) -> LaunchPlan | None:
    """The RoPE-in launch for this step's attention, or None (prefill or mixed steps, a
    variant without the decode kernel, a step too small for a group a CTA)."""
    if (not ka.ROPE_IN or meta.max_chunk != 1 or meta.mixed is not None
            or be.cfg.head_dim != ka.HEAD_DIM):
        return None
    cfg = be.cfg
    return ka.rope_in_plan(cfg.n_heads, cfg.n_kv_heads, meta.segments.shape[0],
                           meta.score_capacity, be.variant)


def attn_in(be: Any, x: Any, layer: int, meta: Any) -> Any:
    """RMSNorm -> QKV (one launch where cupy_mma fuses it), then RoPE and the K/V store:
    Q [T, H * 64] from rope_store, or the raw QKV as ``RawQKV`` where this step's attention
    takes them."""
    qkv = cupy_mma.norm_gemm(be, x, f"l{layer}.attn_norm", f"l{layer}.qkv")
    rope_in = plan(be, meta)
    if qkv is None and rope_in is None:
        return stages.attn_in(be, x, layer, meta)
    if qkv is None:
        qkv = be.linear(be.rmsnorm(x, f"l{layer}.attn_norm"), f"l{layer}.qkv")
    return be.rope_and_store(qkv, layer, meta) if rope_in is None else RawQKV(qkv, rope_in)


def attention(be: Any, raw: RawQKV, layer: int, meta: Any) -> Any:
    """Attention of the step's rows [T, H * 64], their K/V stored on the way."""
    cfg = be.cfg
    out = be.new((raw.qkv.shape[0], cfg.q_dim))
    ka.decode_attention_rope(raw.qkv, be._cos, be._sin, be.k_pool, be.v_pool, layer,
                             meta.segments, meta.page_tables, out, n_heads=cfg.n_heads,
                             n_kv_heads=cfg.n_kv_heads, score_capacity=meta.score_capacity,
                             plan=raw.plan, pdl=be.options.pdl)
    return out
