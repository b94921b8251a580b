"""The numpy backend: the CPU oracle, batch-invariant by construction.

- GEMMs go through fixed-shape column tiles (``numpy_gemm``), so a row's result never
  depends on how many rows the step has.
- Row reductions (RMSNorm's sum of squares) are running sums in index order.
- Attention is ``numpy_attention``: canonical per-distribution order, history read only
  through page tables.
- int8 weights keep their int8 codes as exact f32 values with per-channel scales and compute
  ``(W_q @ x) * scale`` in f32: the same numerics a GPU int8 kernel has, at f32 speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crucible.backend.numpy_attention import paged_attention
from crucible.backend.numpy_gemm import gemm_rows
from crucible.backend.rope import rope_table
from crucible.engine.batch import PackedBatch
from crucible.model.config import ModelConfig
from crucible.model.weights import ModelWeights, quantize_int8

# Tile widths are part of the arithmetic order, so they are constants, not per-step choices.
# On the 2-core CI machine 8 balances single-stream decode (a 1-row step still pays for a
# whole tile) against prefill (wider tiles repack the weight less often); see
# docs/cpu-performance.md. The LM head only sees final rows (often one): narrower still.
LAYER_TILE = 8
LM_HEAD_TILE = 4


@dataclass(frozen=True)
class NumpyMeta:
    token_ids: np.ndarray
    positions: np.ndarray
    pages: np.ndarray  # physical page of each row
    slots: np.ndarray  # slot within the page of each row
    segments: np.ndarray
    page_tables: np.ndarray
    final_rows: np.ndarray


class NumpyBackend:
    name = "numpy"

    def __init__(self) -> None:
        self.cfg: ModelConfig | None = None
        self.mode = "f32"
        self._linear: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        self._norms: dict[str, np.ndarray] = {}
        self.embedding: np.ndarray | None = None
        self.k_pool: np.ndarray | None = None
        self.v_pool: np.ndarray | None = None

    def load_weights(self, cfg: ModelConfig, weights: ModelWeights, mode: str) -> None:
        if mode not in ("f32", "int8"):
            raise ValueError(f"weights mode must be 'f32' or 'int8', got {mode!r}")
        self.cfg, self.mode = cfg, mode
        self.embedding = np.ascontiguousarray(weights.embed, dtype=np.float32)
        self._cos, self._sin = rope_table(cfg.max_context, cfg.head_dim, cfg.rope_theta)

        def put(name: str, w: np.ndarray) -> None:
            if mode == "int8":
                qw = quantize_int8(w)
                self._linear[name] = (qw.q.astype(np.float32), qw.scale)
            else:
                self._linear[name] = (np.ascontiguousarray(w, dtype=np.float32), None)

        for i, lw in enumerate(weights.layers):
            put(f"l{i}.qkv", np.concatenate([lw.wq, lw.wk, lw.wv]))
            put(f"l{i}.o", lw.wo)
            put(f"l{i}.gate_up", np.concatenate([lw.w_gate, lw.w_up]))
            put(f"l{i}.down", lw.w_down)
            self._norms[f"l{i}.attn_norm"] = lw.attn_norm.astype(np.float32)
            self._norms[f"l{i}.ffn_norm"] = lw.ffn_norm.astype(np.float32)
        put("lm_head", weights.head)
        self._norms["final_norm"] = weights.final_norm.astype(np.float32)
        # Calibrate every GEMM shape now, so the first request does not pay for it.
        for name, (w, _) in self._linear.items():
            gemm_rows(w, np.zeros((1, w.shape[1]), dtype=np.float32),
                      LM_HEAD_TILE if name == "lm_head" else LAYER_TILE)

    def allocate_pool(self, num_pages: int) -> None:
        cfg = self.cfg
        shape = (num_pages, cfg.n_layers, 16, cfg.kv_dim)
        self.k_pool = np.zeros(shape, dtype=np.float32)
        self.v_pool = np.zeros(shape, dtype=np.float32)

    def prepare(self, batch: PackedBatch) -> NumpyMeta:
        slots = batch.slot_mapping()
        return NumpyMeta(batch.token_ids, batch.positions, slots >> 4, slots & 15,
                         batch.segments, batch.page_tables, batch.final_rows)

    def embed(self, meta: NumpyMeta) -> np.ndarray:
        return self.embedding[meta.token_ids]

    def rmsnorm(self, x: np.ndarray, weight: str) -> np.ndarray:
        # Running sum in index order: the same rounding for every row whatever the batch.
        ss = np.cumsum(x * x, axis=1)[:, -1:]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[1]) + np.float32(self.cfg.rms_eps))
        return (x * inv) * self._norms[weight]

    def linear(self, x: np.ndarray, weight: str) -> np.ndarray:
        w, scale = self._linear[weight]
        y = gemm_rows(w, x, LM_HEAD_TILE if weight == "lm_head" else LAYER_TILE)
        return y if scale is None else y * scale

    def linear_add(self, x: np.ndarray, weight: str, residual: np.ndarray) -> np.ndarray:
        return residual + self.linear(x, weight)

    def rope_and_store(self, qkv: np.ndarray, layer: int, meta: NumpyMeta) -> np.ndarray:
        cfg = self.cfg
        q = qkv[:, : cfg.q_dim].reshape(-1, cfg.n_heads, cfg.head_dim)
        k = qkv[:, cfg.q_dim : cfg.q_dim + cfg.kv_dim].reshape(-1, cfg.n_kv_heads, cfg.head_dim)
        v = qkv[:, cfg.q_dim + cfg.kv_dim :]
        cos = self._cos[meta.positions][:, None, :]
        sin = self._sin[meta.positions][:, None, :]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        self.k_pool[meta.pages, layer, meta.slots] = k.reshape(-1, cfg.kv_dim)
        self.v_pool[meta.pages, layer, meta.slots] = v
        return q.reshape(-1, cfg.q_dim)

    def attention(self, q: np.ndarray, layer: int, meta: NumpyMeta) -> np.ndarray:
        return paged_attention(q, self.k_pool, self.v_pool, layer, meta.segments,
                               meta.page_tables, self.cfg.n_kv_heads, self.cfg.head_dim)

    def swiglu(self, gate_up: np.ndarray) -> np.ndarray:
        f = gate_up.shape[1] // 2
        g, u = gate_up[:, :f], gate_up[:, f:]
        return (g / (np.float32(1.0) + np.exp(-g))) * u

    def gather_rows(self, x: np.ndarray, meta: NumpyMeta) -> np.ndarray:
        return x[meta.final_rows]

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE: pairs (i, i + hd/2) rotate by the angle of frequency i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
