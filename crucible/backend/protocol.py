"""The backend contract: every operation the model forward and the runner call.

``crucible.model.llama`` is written once against these operations; the numpy backend is the
oracle and the CuPy backend binds our CUDA kernels. Every backend implements every method:
a capability a backend lacks is an explicit answer (``decode_stack`` returns None,
``fed_ids`` returns None, ``device_sampler`` returns None), never a missing attribute.
Arrays are backend-native (numpy or cupy); activations are packed rows [T, features].

Numerics (docs/numerics.md): each output element is computed in an order that does not
depend on how many rows are in the step, where a row sits, how a prompt was chunked or
which physical pages hold its history. A fused stage group gives the bits of its
composition (``stages.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from crucible.step.batch import PackedBatch
from crucible.step.rows import RowSampler

Array = Any
StepMeta = Any
Forward = Callable[[StepMeta], Array]  # step metadata -> logits of the final rows
# Backend.graph_stats' counters (the engine's stats, the server's /metrics): steps replayed
# from decode, prefill and mixed graphs, graphs captured, host ms in on-demand captures.
GRAPH_STATS = ("graph_decode_replays", "graph_prefill_replays", "graph_mixed_replays",
               "graph_captures", "graph_capture_ms",
               # graphs dropped for want of device memory, steps run again after running out
               "graph_memory_drops", "graph_memory_retries",
               # device bytes the graphs hold now (pools and logits buffers: a gauge)
               "graph_memory_bytes")


@dataclass(frozen=True)
class Geometry:
    """A Llama-style decoder's shape: what a backend reads of the model (the model's
    ``ModelConfig`` extends it with the checks of a checkpoint's metadata)."""

    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    max_context: int
    rope_theta: float
    rms_eps: float

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def row_bytes(self) -> int:
        """f32 bytes of one row's intermediates in a forward (an upper estimate): what a
        step's scratch grows by per row (engine/pool_size.py, backend/cupy_memory.py)."""
        return 4 * (6 * self.hidden_size + 3 * self.ffn_size + 3 * self.q_dim
                    + 2 * self.kv_dim)


@dataclass(frozen=True)
class LinearWeight:
    """One linear layer [out, in]: f32 weights (``scale`` None) or int8 codes and their f32
    per-output-channel scales."""

    w: np.ndarray
    scale: np.ndarray | None = None


@dataclass(frozen=True)
class BackendWeights:
    """The tensors a backend uploads, by the names the forward uses: linears ``l{i}.qkv``,
    ``l{i}.o``, ``l{i}.gate_up``, ``l{i}.down``, ``lm_head``; norms ``l{i}.attn_norm``,
    ``l{i}.ffn_norm``, ``final_norm``."""

    mode: str  # "f32" | "int8"
    embedding: np.ndarray  # [V, D] f32
    linears: dict[str, LinearWeight]
    norms: dict[str, np.ndarray]


class Backend(Protocol):
    name: str  # "numpy" | "cupy" (a wrapper reports the backend it wraps)
    device: str  # "cpu" | "cuda"

    @property
    def arithmetic(self) -> str:
        """What decides the bits of its results besides the model (kernel family, attention
        variant): two backends with the same value compute the same bits."""

    # --- set-up (once) ---
    def load_weights(self, geometry: Geometry, weights: BackendWeights) -> None: ...
    def allocate_pool(self, num_pages: int) -> None: ...
    def memory_info(self) -> tuple[int, int] | None:
        """(free, total) bytes of device memory, after handing back to the device what the
        backend's allocator holds unused; None for host memory (the CPU)."""

    def capture_graphs(self, forward: Forward, max_rows: int) -> int:
        """Capture, before any request, the graphs that steps of up to ``max_rows`` rows will
        replay most (the decode steps'); how many were captured (0: none here)."""

    def graph_stats(self) -> dict[str, int]:
        """GRAPH_STATS: how the steps so far ran (all zero where there are no graphs)."""

    def device_sampler(self) -> RowSampler | None:
        """A sampler that works on this backend's logits where they are, or None (the
        engine then samples on the host)."""

    # --- one step ---
    def run_step(self, batch: PackedBatch, forward: Forward,
                 feed: np.ndarray | None = None) -> Array:
        """Logits [R, vocab] of the final rows, on the backend (valid until the next step).
        ``forward`` is the model's forward over step metadata; a backend may replay a
        captured graph of it instead. ``feed`` (pipelined decode): per row, the index of the
        previous step's sampled id that is its input token (-1: the batch's own)."""

    def first_use(self, batch: PackedBatch, fed: bool) -> bool:
        """Whether ``run_step`` of ``batch`` (``fed``: with a feed) would be a graph's first
        use: a capture, or an eager forward of a shape a graph kind takes but holds no graph
        for yet (a first sighting). Such a launch holds the host for milliseconds, so the
        engine collects the step in flight first (engine/engine.py). False without graphs."""

    def fed_ids(self, rows: int) -> Array | None:
        """Where the latest step's sampled ids live on the device so that a fed step can
        read them, or None when no fed step can follow (no pipelining here)."""

    def mixed_feed_rows(self) -> int | None:
        """The fewest rows a fed step holding prefill slices should have (engine/
        pipeline_next.py), or None when only decode steps can be fed."""

    def sampled_ids(self, rows: int) -> Array | None:
        """The latest step's greedy ids when its graph already ran the argmax, else None."""

    def ids_copied(self, event: Any) -> None:
        """The latest step's ids are being copied to the host until ``event``."""

    # --- the forward's operations ---
    def prepare(self, batch: PackedBatch) -> StepMeta:
        """Upload the step's metadata in one go (positions, descriptors, tables, slots)."""

    def decode_stack(self, meta: StepMeta) -> Array | None:
        """The whole layer stack in the backend's own kernels, or None for this step."""

    def embed(self, meta: StepMeta) -> Array: ...  # [T, D]
    def rmsnorm(self, x: Array, weight: str) -> Array: ...
    def linear(self, x: Array, weight: str) -> Array: ...  # [T, in] -> [T, out]
    def linear_add(self, x: Array, weight: str, residual: Array) -> Array:
        """residual + linear(x, weight), rounded exactly as the two steps would be."""

    def rope_and_store(self, qkv: Array, layer: int, meta: StepMeta) -> Array:
        """Rotate Q and K by absolute position, scatter K/V into the pool; return Q."""

    def attention(self, q: Array, layer: int, meta: StepMeta) -> Array: ...  # [T, H*hd]
    def swiglu(self, gate_up: Array) -> Array: ...  # [T, 2F] -> [T, F]
    # Stage groups (stages.py composes them from the operations above).
    def fuses(self, x: Array, group: str) -> bool:
        """Whether ``group`` (attn_in, mlp_in, norm_linear) runs as one kernel for x."""

    def attn_in(self, x: Array, layer: int, meta: StepMeta) -> Array: ...
    def mlp_in(self, x: Array, layer: int) -> Array: ...
    def norm_linear(self, x: Array, norm: str, weight: str) -> Array: ...
    def gather_rows(self, x: Array, meta: StepMeta) -> Array: ...  # the final rows
    def to_host(self, x: Array) -> np.ndarray: ...
