"""Pick a backend for ``--device auto|cpu|cuda``."""

from __future__ import annotations

import importlib.util
import os

from crucible.errors import BackendUnavailableError, ConfigError

DEVICES = ("auto", "cpu", "cuda")


def env_flag(name: str) -> bool:
    """A 0/1 switch from the environment (default on); anything else is a clear error."""
    value = os.environ.get(name, "1").strip()
    if value not in ("0", "1"):
        raise ConfigError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def gpu_available() -> bool:
    """True when CuPy imports and a CUDA device answers."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def cuda_backend_available() -> bool:
    return importlib.util.find_spec("crucible.backend.cupy_backend") is not None


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "cpu":
        return "cpu"
    usable = cuda_backend_available() and gpu_available()
    if device == "auto":
        return "cuda" if usable else "cpu"
    if not cuda_backend_available():
        raise BackendUnavailableError(
            "--device cuda: the CuPy backend is not part of this build yet; use --device cpu")
    if not gpu_available():
        raise BackendUnavailableError(
            "--device cuda: no CUDA GPU answered (is cupy-cuda13x installed? "
            "pip install 'crucible-llm[cuda]')")
    return "cuda"


def make_backend(device: str, attention: str | None = None):
    if resolve_device(device) == "cuda":
        from crucible.backend.cupy_backend import CupyBackend
        from crucible.kernels.variants import parse_variant

        return CupyBackend(variant=parse_variant(attention) if attention else None)
    from crucible.backend.numpy_backend import NumpyBackend

    return NumpyBackend()
