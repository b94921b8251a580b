"""Where the CUDA sources live: ``cuda/`` in a checkout, ``crucible/_cuda`` in a wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def cuda_source_dir() -> Path:
    """The directory holding ``*.cu``/``*.cuh``; a checkout wins over installed copies."""
    for candidate in (_PACKAGE_DIR.parent / "cuda", _PACKAGE_DIR / "_cuda"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"no CUDA sources found next to {_PACKAGE_DIR} (looked in ../cuda and _cuda)")


def read_cuda_source(name: str) -> str:
    return (cuda_source_dir() / name).read_text()
