"""Model geometry: one frozen dataclass shared by loaders, backends and the scheduler."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json

from crucible.errors import ModelLoadError


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder. Every field comes from the checkpoint's metadata."""

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
    tie_embeddings: bool = True

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

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
