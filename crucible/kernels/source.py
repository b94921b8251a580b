"""Where the CUDA sources live: ``cuda/`` in a checkout, ``crucible/_cuda`` in a wheel."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

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


def module_source(name: str) -> str:
    """``name``'s text as NVRTC gets it: with a digest of every header in the source
    directory appended as a comment. CuPy's on-disk kernel cache keys a module by its own
    text, not by what it includes, so without this a changed ``.cuh`` under an unchanged
    ``.cu`` (an upgrade, a checkout of another commit) would load the stale binary."""
    h = hashlib.sha256()
    for f in sorted(cuda_source_dir().glob("*.cuh")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return read_cuda_source(name) + f"\n// headers: {h.hexdigest()}\n"


def compile_module(name: str, names: tuple[str, ...] = ()) -> Any:
    """``name`` (a file in the source directory) as a CuPy RawModule, with the project's one
    set of options: C++17 and the source directory on the include path. No fast-math: the
    kernels spell out their rounding with intrinsics, and fast-math would change division
    and denormals. ``names``: the template instantiations to compile (extern "C" kernels
    need none). Callers cache the module (functools.cache): NVRTC runs once per process."""
    import cupy

    extra = {"name_expressions": names} if names else {}
    return cupy.RawModule(code=module_source(name),
                          options=("-std=c++17", f"-I{cuda_source_dir()}"), **extra)


@functools.cache
def cached_module(name: str, names: tuple[str, ...] = ()) -> Any:
    """``compile_module``, once per process for each source and set of instantiations (the
    kernel wrappers' compile cache)."""
    return compile_module(name, names)
