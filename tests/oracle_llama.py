"""An independent float64 Llama forward for tests: contiguous history, no pages, no backend.

Written from the model definition (HF rotate-half RoPE, GQA by repeating KV heads, RMSNorm,
SwiGLU), sharing nothing with crucible.backend, so agreement is evidence for both.
"""

from __future__ import annotations

import numpy as np


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None] * inv[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def oracle_logits(cfg, weights, tokens: list[int]) -> np.ndarray:
    """Logits (float64) of every position of ``tokens`` processed as one causal sequence."""
    f = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    t = len(tokens)
    hd, g = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    pos = np.arange(t, dtype=np.float64)
    x = f(weights.embed)[tokens]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for lw in weights.layers:
        h = _rms(x, f(lw.attn_norm), cfg.rms_eps)
        q = (h @ f(lw.wq).T).reshape(t, cfg.n_heads, hd)
        k = (h @ f(lw.wk).T).reshape(t, cfg.n_kv_heads, hd)
        v = (h @ f(lw.wv).T).reshape(t, cfg.n_kv_heads, hd)
        q, k = _rope(q, pos, cfg.rope_theta), _rope(k, pos, cfg.rope_theta)
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", p, v).reshape(t, -1)
        x = x + a @ f(lw.wo).T
        h = _rms(x, f(lw.ffn_norm), cfg.rms_eps)
        gate, up = h @ f(lw.w_gate).T, h @ f(lw.w_up).T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ f(lw.w_down).T
    return _rms(x, f(weights.final_norm), cfg.rms_eps) @ f(weights.head).T
