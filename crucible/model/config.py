"""The model's configuration: its geometry (the backend contract's ``Geometry``) plus the
checks of a checkpoint's metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import json
import math
import numbers
from typing import Any

from crucible.backend.protocol import Geometry
from crucible.errors import ModelLoadError

# The longest context a model may declare. Every backend builds a RoPE table of
# max_context rows at start-up and the CPU pool defaults to two contexts, so a corrupt or
# hostile value (2**40) must stop here, not as a multi-terabyte allocation. 2**20 is above
# every Llama-architecture checkpoint in use (128K for Llama 3.1, 1M for the longest).
MAX_CONTEXT = 1 << 20


def whole_number(source: str, key: str, value: Any) -> int:
    """A metadata value that must be an integer: an int, or a float with no fraction (JSON
    writers emit 2048.0). Strings, booleans and arrays are refused by name, not coerced:
    int("64") or int(True) would hide a broken file behind a later, stranger error."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ModelLoadError(f"{source}: {key} must be a whole number, got {value!r}")


def real_number(source: str, key: str, value: Any) -> float:
    """A metadata value that must be a finite number (NaN and inf are refused)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and math.isfinite(float(value)):
        return float(value)
    raise ModelLoadError(f"{source}: {key} must be a finite number, got {value!r}")


def flag(source: str, key: str, value: Any) -> bool:
    """A metadata value that must be true or false: bool("false") is True."""
    if isinstance(value, bool):
        return value
    raise ModelLoadError(f"{source}: {key} must be true or false, got {value!r}")


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
        if self.max_context > MAX_CONTEXT:
            raise ModelLoadError(f"{source}: max_context={self.max_context:,} is more than "
                                 f"the {MAX_CONTEXT:,} positions this runtime supports")
        for name in ("rope_theta", "rms_eps"):  # NaN fails "> 0"; inf does not
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ModelLoadError(f"{source}: {name} must be a positive finite number, "
                                     f"got {value!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)
