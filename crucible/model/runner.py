"""ModelRunner: a loaded model bound to a backend and a page pool.

The engine hands it validated packed batches; it returns logits of the final rows. It
makes no policy decision (which rows, which pages): that is the scheduler's.
"""

from __future__ import annotations

import numpy as np

from crucible.backend.select import make_backend
from crucible.engine.batch import PackedBatch
from crucible.errors import ConfigError
from crucible.kernels.variants import variant_from_env
from crucible.model import llama
from crucible.model.config import ModelConfig
from crucible.model.loader import LoadedModel


class ModelRunner:
    def __init__(self, model: LoadedModel, *, num_pages: int, device: str = "cpu",
                 attention: str | None = None) -> None:
        """``attention``: an attention variant name for the GPU backend (default: the
        CRUCIBLE_PREFILL_ATTN setting); the numpy backend has one canonical attention."""
        if num_pages <= 0:
            raise ConfigError(f"num_pages must be positive, got {num_pages}")
        # A bad CRUCIBLE_PREFILL_ATTN is a start-up error on every device, not only on GPUs.
        variant_from_env()
        self.model = model
        self.num_pages = num_pages
        self.backend = make_backend(device, attention)
        self.device = "cuda" if self.backend.name != "numpy" else "cpu"
        self.backend.load_weights(model.config, model.weights, model.weights_mode)
        self.backend.allocate_pool(num_pages)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def forward(self, batch: PackedBatch) -> np.ndarray:
        """f32 logits [len(batch.final_rows), vocab]; K/V of every row land in the pool."""
        step = getattr(self.backend, "run_step", None)  # a backend with its own fast path
        if step is not None:
            return step(batch)
        return llama.forward(self.model.config, self.backend, batch)
