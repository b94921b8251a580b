"""The model's configuration: its geometry (the backend contract's ``Geometry``) plus the
checks of a checkpoint's metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json

from crucible.backend.protocol import Geometry
from crucible.errors import ModelLoadError


@dataclass(frozen=True)
class ModelConfig(Geometry):
    """A Llama-style decoder. Every field comes from the checkpoint's metadata."""

    tie_embeddings: bool = True

    def validate(self, source: str) -> None:
        """Reject geometries the runtime cannot run, naming the file and the field."""
        positive = ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads",
                    "head_dim", "ffn_size", "max_context")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ModelLoadError(f"{source}: {name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ModelLoadError(f"{source}: n_heads={self.n_heads} is not a multiple of "
                                 f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ModelLoadError(f"{source}: head_dim={self.head_dim} must be even for RoPE")
        if not (self.rope_theta > 0 and self.rms_eps > 0):
            raise ModelLoadError(f"{source}: rope_theta and rms_eps must be positive")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)
