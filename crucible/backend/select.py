"""Pick a backend for ``--device auto|cpu|cuda``."""

from __future__ import annotations

import importlib.util

from crucible.backend.options import BackendOptions
from crucible.backend.protocol import Backend
from crucible.errors import BackendUnavailableError, ConfigError

DEVICES = ("auto", "cpu", "cuda")


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


def make_backend(device: str, options: BackendOptions | None = None) -> Backend:
    options = options or BackendOptions()
    if resolve_device(device) == "cuda":
        from crucible.backend import cupy_prebuild
        from crucible.backend.cupy_backend import CupyBackend

        cupy_prebuild.start(options)  # NVRTC on a pool while the model loads
        return CupyBackend(options)
    from crucible.backend.numpy_backend import NumpyBackend

    return NumpyBackend(threads=options.cpu_threads)
