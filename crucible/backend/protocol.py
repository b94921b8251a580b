"""The small set of operations the transformer is written against.

``crucible.model.llama`` calls only these; the numpy backend is the oracle and the CuPy
backend binds our CUDA kernels. Arrays are backend-native (numpy or cupy); the model never
looks inside them. Shapes are given as [rows, features] for packed activations.

Contract every backend keeps (DESIGN section 5): each output element is computed in an
order that does not depend on how many rows are in the batch, where a row sits, how a prompt
was chunked or which physical pages hold its history.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from crucible.engine.batch import PackedBatch
from crucible.model.config import ModelConfig
from crucible.model.weights import ModelWeights

Array = Any
StepMeta = Any


class Backend(Protocol):
    name: str

    # --- set-up (once) ---
    def load_weights(self, cfg: ModelConfig, weights: ModelWeights, mode: str) -> None: ...
    def allocate_pool(self, num_pages: int) -> None: ...

    # --- per step ---
    def prepare(self, batch: PackedBatch) -> StepMeta:
        """Upload the step's metadata in one go (positions, descriptors, tables, slots)."""

    def embed(self, meta: StepMeta) -> Array:  # [T, D]
        ...

    def rmsnorm(self, x: Array, weight: str) -> Array:  # weight: a named norm vector
        ...

    def linear(self, x: Array, weight: str) -> Array:  # [T, in] -> [T, out]
        ...

    def linear_add(self, x: Array, weight: str, residual: Array) -> Array:
        """residual + linear(x, weight), rounded exactly as the two steps would be."""

    def rope_and_store(self, qkv: Array, layer: int, meta: StepMeta) -> Array:
        """Rotate Q and K by absolute position, scatter K/V into the pool; return Q [T, H*hd]."""

    def attention(self, q: Array, layer: int, meta: StepMeta) -> Array:  # [T, H*hd]
        ...

    def swiglu(self, gate_up: Array) -> Array:  # [T, 2F] -> [T, F]
        ...

    def gather_rows(self, x: Array, meta: StepMeta) -> Array:  # the final rows
        ...

    def to_host(self, x: Array) -> np.ndarray:
        ...
