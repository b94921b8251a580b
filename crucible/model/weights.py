"""Host weights in one canonical form (f32, HF orientation) plus int8 quantization.

Every loader produces ``ModelWeights``: f32 arrays with linear weights shaped
[out_features, in_features] and Q/K rows in the HF ("rotate-half") RoPE order. Backends
turn them into their own layout once at start-up.

int8 mode: symmetric per-output-channel scales, ``scale = max|w_row| / 127``,
``q = clip(round(w / scale), -127, 127)``. A row of zeros gets scale 1 (q is all zero).
Activations stay f32; a backend computes ``(sum_k x_k * q_k) * scale`` in f32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from crucible.backend.protocol import BackendWeights, Geometry, LinearWeight
from crucible.errors import ModelLoadError


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # [D]
    wq: np.ndarray  # [H*hd, D]
    wk: np.ndarray  # [KV*hd, D]
    wv: np.ndarray  # [KV*hd, D]
    wo: np.ndarray  # [D, H*hd]
    ffn_norm: np.ndarray  # [D]
    w_gate: np.ndarray  # [F, D]
    w_up: np.ndarray  # [F, D]
    w_down: np.ndarray  # [D, F]


@dataclass(frozen=True)
class ModelWeights:
    embed: np.ndarray  # [V, D]
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray  # [D]
    lm_head: np.ndarray | None = None  # [V, D]; None when tied to the embedding
    extra: dict = field(default_factory=dict)

    @property
    def head(self) -> np.ndarray:
        return self.embed if self.lm_head is None else self.lm_head


@dataclass(frozen=True)
class QuantizedLinear:
    """int8 codes [out, in] and their f32 per-output-channel scales [out]."""

    q: np.ndarray
    scale: np.ndarray

    def dequantize(self) -> np.ndarray:
        return self.q.astype(np.float32) * self.scale[:, None]


def check_finite(a: np.ndarray, name: str, source: object) -> None:
    """A weight with NaN or inf makes every logit NaN: refuse it at load, naming it, not
    as silent garbage text (and int8 scales of inf) later."""
    if not np.isfinite(a).all():
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        raise ModelLoadError(f"{source}: tensor {name} holds {bad:,} NaN or infinite values")


def quantize_int8(w: np.ndarray) -> QuantizedLinear:
    w = np.asarray(w, dtype=np.float32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return QuantizedLinear(q=q, scale=scale)


def unpermute_llama_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's GGUF Q/K row order (interleaved RoPE pairs) -> HF rotate-half order.

    GGUF rows of a head are ordered (pair i, member m) for RoPE pairs (2i, 2i+1); HF orders
    them (member m, pair i) so that pairs are (i, i + hd/2).
    """
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def permute_llama_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half order -> llama.cpp's GGUF order (the inverse of ``unpermute_llama_qk``)."""
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


WEIGHT_MODES = ("int8", "f32")


def backend_weights(weights: ModelWeights, mode: str) -> BackendWeights:
    """The tensors under the names the forward uses (llama.py), each linear in ``mode``:
    Q, K and V fused into one [q + 2 kv, D] layer, gate and up into one [2F, D]."""
    if mode not in WEIGHT_MODES:
        raise ValueError(f"weights mode must be 'f32' or 'int8', got {mode!r}")

    def lin(w: np.ndarray) -> LinearWeight:
        if mode == "int8":
            qw = quantize_int8(w)
            return LinearWeight(qw.q, qw.scale)
        return LinearWeight(np.ascontiguousarray(w, dtype=np.float32))

    linears: dict[str, LinearWeight] = {}
    norms: dict[str, np.ndarray] = {}
    for i, lw in enumerate(weights.layers):
        linears[f"l{i}.qkv"] = lin(np.concatenate([lw.wq, lw.wk, lw.wv]))
        linears[f"l{i}.o"] = lin(lw.wo)
        linears[f"l{i}.gate_up"] = lin(np.concatenate([lw.w_gate, lw.w_up]))
        linears[f"l{i}.down"] = lin(lw.w_down)
        norms[f"l{i}.attn_norm"] = lw.attn_norm.astype(np.float32)
        norms[f"l{i}.ffn_norm"] = lw.ffn_norm.astype(np.float32)
    linears["lm_head"] = lin(weights.head)
    norms["final_norm"] = weights.final_norm.astype(np.float32)
    return BackendWeights(mode, np.ascontiguousarray(weights.embed, dtype=np.float32),
                          linears, norms)


def check_backend_weights(weights: BackendWeights, geometry: Geometry) -> None:
    """Raise ValueError unless ``weights`` has exactly the tensors ``backend_weights`` makes
    for ``geometry``, with their shapes and dtypes: what a prepared file read back must
    hold, or the first forward fails on a missing key or a mismatched GEMM."""
    g, int8 = geometry, weights.mode == "int8"
    want = {"lm_head": (g.vocab_size, g.hidden_size)}
    norms = {"final_norm": (g.hidden_size,)}
    for i in range(g.n_layers):
        want.update({f"l{i}.qkv": (g.q_dim + 2 * g.kv_dim, g.hidden_size),
                     f"l{i}.o": (g.hidden_size, g.q_dim),
                     f"l{i}.gate_up": (2 * g.ffn_size, g.hidden_size),
                     f"l{i}.down": (g.hidden_size, g.ffn_size)})
        norms.update({f"l{i}.attn_norm": (g.hidden_size,), f"l{i}.ffn_norm": (g.hidden_size,)})
    if set(weights.linears) != set(want) or set(weights.norms) != set(norms):
        raise ValueError("its tensors are not the ones this model's geometry needs")
    got = [("embedding", weights.embedding, (g.vocab_size, g.hidden_size), np.float32)]
    got += [(k, weights.norms[k], shape, np.float32) for k, shape in norms.items()]
    for k, shape in want.items():
        lw = weights.linears[k]
        got.append((k, lw.w, shape, np.int8 if int8 else np.float32))
        if int8 or lw.scale is not None:
            got.append((f"scale of {k}", lw.scale, shape[:1], np.float32))
    for name, a, shape, dtype in got:
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dtype:
            raise ValueError(f"tensor {name} is {getattr(a, 'dtype', None)} "
                             f"{getattr(a, 'shape', None)}, expected {np.dtype(dtype)} {shape}")
