"""The numpy backend: the CPU oracle, batch-invariant by construction.

Two implementations of the same promise (a row's result never depends on the other rows of
the step, its position among them, the prompt's chunking or the pages holding its history):

- **compiled** (the extension ``crucible.backend._cpu`` is built, the normal install): GEMMs
  run the canonical order of cuda/linear.cu (``cpu_gemm``: the same bits as the GPU for the
  same inputs), on weights packed at load time, int8 codes kept as int8. RMSNorm, SwiGLU,
  RoPE and attention run compiled too (``cpu_ops``), each in its own fixed order.
- **BLAS tiles** (no extension, e.g. a source checkout on PYTHONPATH): GEMMs through
  fixed-shape column tiles (``numpy_gemm``), RMSNorm as a running sum in index order,
  attention in ``numpy_attention``'s BLAS blocks; int8 codes held as f32. Slower, and its
  bits differ from the compiled path's (both are invariant; docs/numerics.md).

int8 weights are computed as ``(sum_k x_k * q_k) * scale`` in f32 on both paths, the same
numerics the GPU int8 kernel has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crucible.backend import cpu_ext, cpu_ops, stages
from crucible.backend.cpu_gemm import PackedWeight, gemm, pack_weight
from crucible.backend.numpy_attention import paged_attention
from crucible.backend.numpy_gemm import gemm_rows
from crucible.backend.protocol import GRAPH_STATS, BackendWeights, Forward, Geometry
from crucible.backend.rope import rope_table
from crucible.step.batch import PackedBatch

# BLAS tile path only. Tile widths are part of the arithmetic order, so they are constants,
# not per-step choices. On the 2-core CI machine 8 balances single-stream decode (a 1-row
# step still pays for a whole tile) against prefill (wider tiles repack the weight less
# often); see docs/cpu-performance.md. The LM head only sees final rows: narrower still.
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
    device = "cpu"

    def __init__(self, threads: int | None = None) -> None:
        self.cfg: Geometry | None = None
        self.mode = "f32"
        self.threads = cpu_ext.check_threads(threads)
        self.compiled = cpu_ext.extension() is not None
        if not self.compiled:
            cpu_ext.announce_fallback()
        self.scalar = False  # compiled path: force the portable kernels (same bits, slower)
        self._linear: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}  # BLAS path
        self._packed: dict[str, PackedWeight] = {}  # compiled path
        self._norms: dict[str, np.ndarray] = {}
        self.embedding: np.ndarray | None = None
        self.k_pool: np.ndarray | None = None
        self.v_pool: np.ndarray | None = None

    @property
    def arithmetic(self) -> str:
        # AVX2 and the portable kernels give the same bits; the BLAS tiles do not.
        return "numpy-compiled" if self.compiled else "numpy-blas-tiles"

    @property
    def kernel(self) -> str:
        """'avx2', 'scalar' (compiled) or 'blas-tiles': what the forward runs on."""
        return cpu_ext.kernel_name(self.scalar) if self.compiled else "blas-tiles"

    def load_weights(self, geometry: Geometry, weights: BackendWeights) -> None:
        cfg = self.cfg = geometry
        self.mode = weights.mode
        self.embedding = weights.embedding
        self._cos, self._sin = rope_table(cfg.max_context, cfg.head_dim, cfg.rope_theta)
        for name, lw in weights.linears.items():
            if self.compiled:
                self._packed[name] = pack_weight(lw.w, lw.scale)
            else:  # BLAS tiles run f32: int8 codes are held as f32, scaled after the GEMM
                self._linear[name] = (np.ascontiguousarray(lw.w, dtype=np.float32), lw.scale)
        self._norms = dict(weights.norms)
        # BLAS path: calibrate every GEMM shape now, so the first request does not pay.
        for name, (w, _) in self._linear.items():
            gemm_rows(w, np.zeros((1, w.shape[1]), dtype=np.float32),
                      LM_HEAD_TILE if name == "lm_head" else LAYER_TILE)

    def allocate_pool(self, num_pages: int) -> None:
        cfg = self.cfg
        shape = (num_pages, cfg.n_layers, 16, cfg.kv_dim)
        self.k_pool = np.zeros(shape, dtype=np.float32)
        self.v_pool = np.zeros(shape, dtype=np.float32)

    def memory_info(self) -> None:
        return None  # host memory: the pool is sized by num_pages

    def device_sampler(self) -> None:
        return None  # the engine samples the host logits itself

    def capture_graphs(self, forward: Forward, max_rows: int) -> int:
        return 0  # every step runs as it comes: there is nothing to capture

    def graph_stats(self) -> dict[str, int]:
        return dict.fromkeys(GRAPH_STATS, 0)

    def run_step(self, batch: PackedBatch, forward: Forward,
                 feed: np.ndarray | None = None) -> np.ndarray:
        if feed is not None:
            raise ValueError("the numpy backend runs no fed (pipelined) steps")
        return forward(self.prepare(batch))

    def first_use(self, batch: PackedBatch, fed: bool) -> bool:
        return False  # no graphs: every step runs as it comes

    def fed_ids(self, rows: int) -> None:
        return None

    def mixed_feed_rows(self) -> None:
        return None

    def sampled_ids(self, rows: int) -> None:
        return None

    def ids_copied(self, event: object) -> None:
        pass

    def decode_stack(self, meta: NumpyMeta) -> None:
        return None

    def prepare(self, batch: PackedBatch) -> NumpyMeta:
        slots = batch.slot_mapping()
        return NumpyMeta(batch.token_ids, batch.positions, slots >> 4, slots & 15,
                         batch.segments, batch.page_tables, batch.final_rows)

    def embed(self, meta: NumpyMeta) -> np.ndarray:
        return self.embedding[meta.token_ids]

    def rmsnorm(self, x: np.ndarray, weight: str) -> np.ndarray:
        if self.compiled:
            return cpu_ops.rmsnorm(x, self._norms[weight], self.cfg.rms_eps,
                                   threads=self.threads, scalar=self.scalar)
        # Running sum in index order: the same rounding for every row whatever the batch.
        ss = np.cumsum(x * x, axis=1)[:, -1:]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[1]) + np.float32(self.cfg.rms_eps))
        return (x * inv) * self._norms[weight]

    def linear(self, x: np.ndarray, weight: str) -> np.ndarray:
        if self.compiled:
            return gemm(x, self._packed[weight], threads=self.threads, scalar=self.scalar)
        w, scale = self._linear[weight]
        y = gemm_rows(w, x, LM_HEAD_TILE if weight == "lm_head" else LAYER_TILE)
        return y if scale is None else y * scale

    def linear_add(self, x: np.ndarray, weight: str, residual: np.ndarray) -> np.ndarray:
        if self.compiled:  # the residual is the order's last step, fused in the kernel
            return gemm(x, self._packed[weight], residual, threads=self.threads,
                        scalar=self.scalar)
        return residual + self.linear(x, weight)

    def rope_and_store(self, qkv: np.ndarray, layer: int, meta: NumpyMeta) -> np.ndarray:
        cfg = self.cfg
        cos, sin = self._cos[meta.positions], self._sin[meta.positions]  # [T, hd/2]
        v = qkv[:, cfg.q_dim + cfg.kv_dim :]
        if self.compiled:
            q = cpu_ops.rope(qkv, 0, cfg.n_heads, cfg.head_dim, cos, sin, threads=self.threads)
            k = cpu_ops.rope(qkv, cfg.q_dim, cfg.n_kv_heads, cfg.head_dim, cos, sin,
                             threads=self.threads)
        else:
            q = _rotate(qkv[:, : cfg.q_dim].reshape(-1, cfg.n_heads, cfg.head_dim),
                        cos[:, None, :], sin[:, None, :]).reshape(-1, cfg.q_dim)
            k = _rotate(qkv[:, cfg.q_dim : cfg.q_dim + cfg.kv_dim].reshape(
                -1, cfg.n_kv_heads, cfg.head_dim), cos[:, None, :], sin[:, None, :])
        self.k_pool[meta.pages, layer, meta.slots] = k.reshape(-1, cfg.kv_dim)
        self.v_pool[meta.pages, layer, meta.slots] = v
        return q

    def attention(self, q: np.ndarray, layer: int, meta: NumpyMeta) -> np.ndarray:
        cfg = self.cfg
        if self.compiled and cfg.head_dim % 8 == 0:
            return cpu_ops.paged_attention(q, self.k_pool, self.v_pool, layer, meta.segments,
                                           meta.page_tables, cfg.n_heads, cfg.n_kv_heads,
                                           cfg.head_dim, threads=self.threads,
                                           scalar=self.scalar)
        return paged_attention(q, self.k_pool, self.v_pool, layer, meta.segments,
                               meta.page_tables, cfg.n_kv_heads, cfg.head_dim)

    def swiglu(self, gate_up: np.ndarray) -> np.ndarray:
        if self.compiled:
            return cpu_ops.swiglu(gate_up, threads=self.threads, scalar=self.scalar)
        f = gate_up.shape[1] // 2
        g, u = gate_up[:, :f], gate_up[:, f:]
        return (g / (np.float32(1.0) + np.exp(-g))) * u

    def fuses(self, x: np.ndarray, group: str) -> bool:
        return False

    def attn_in(self, x: np.ndarray, layer: int, meta: NumpyMeta) -> np.ndarray:
        return stages.attn_in(self, x, layer, meta)

    def mlp_in(self, x: np.ndarray, layer: int) -> np.ndarray:
        return stages.mlp_in(self, x, layer)

    def norm_linear(self, x: np.ndarray, norm: str, weight: str) -> np.ndarray:
        return stages.norm_linear(self, x, norm, weight)

    def gather_rows(self, x: np.ndarray, meta: NumpyMeta) -> np.ndarray:
        return x[meta.final_rows]

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE: pairs (i, i + hd/2) rotate by the angle of frequency i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
