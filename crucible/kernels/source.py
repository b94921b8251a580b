"""Where the CUDA sources live: ``cuda/`` in a checkout, ``crucible/_cuda`` in a wheel."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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
    headers = sorted(cuda_source_dir().glob("*.cuh"))
    stamp = tuple((f, st.st_size, st.st_mtime_ns) for f in headers for st in (f.stat(),))
    return read_cuda_source(name) + f"\n// headers: {_headers_digest(stamp)}\n"


@functools.lru_cache(maxsize=8)
def _headers_digest(stamp: tuple[tuple[Path, int, int], ...]) -> str:
    """The headers' digest, read and hashed once per set of (path, size, time): the start-up
    prebuild asks for it for every program of every module."""
    h = hashlib.sha256()
    for f, _, _ in stamp:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def compile_module(name: str, names: tuple[str, ...] = ()) -> Any:
    """``name`` (a file in the source directory) as a CuPy RawModule, with the project's one
    set of options: C++17 and the source directory on the include path. No fast-math: the
    kernels spell out their rounding with intrinsics, and fast-math would change division
    and denormals. ``names``: the template instantiations to compile (extern "C" kernels
    need none). ``cached_module`` keeps what it builds: NVRTC runs once per process."""
    import cupy

    extra = {"name_expressions": names} if names else {}
    return cupy.RawModule(code=module_source(name),
                          options=("-std=c++17", f"-I{cuda_source_dir()}"), **extra)


# Instantiations one NVRTC program holds at most. NVRTC builds a program on one thread, so a
# module of 29 templates (attention.cu) is one 5-10 s build that no thread pool can shorten;
# as parts of at most 8 it is several builds that run side by side (backend/cupy_prebuild.py).
SPLIT_NAMES = 8


def split_names(names: tuple[str, ...], most: int = SPLIT_NAMES) -> tuple[tuple[str, ...], ...]:
    """``names`` in consecutive parts of at most ``most`` (one empty part for none)."""
    if not names:
        return ((),)
    count = -(-len(names) // most)
    size, extra = divmod(len(names), count)  # as even as they can be: 29 -> 8, 7, 7, 7
    ends = [(i + 1) * size + min(i + 1, extra) for i in range(count)]
    return tuple(names[e - size - (i < extra):e] for i, e in enumerate(ends))


@functools.cache
def _part(name: str, names: tuple[str, ...]) -> Any:
    return compile_module(name, names)


@dataclass(frozen=True)
class KernelModule:
    """A source's kernels as one or more NVRTC programs (``parts``), each compiled once per
    process on first use. A template's code does not depend on which other templates share
    its program: each instantiation is its own function, built from the same text with the
    same options (the prebuild's GPU test compares the bits)."""

    name: str
    parts: tuple[tuple[str, ...], ...]

    def get_function(self, kernel: str) -> Any:
        for part in self.parts:
            if kernel in part or not part:
                return _part(self.name, part).get_function(kernel)
        raise KeyError(f"{self.name} is not built with {kernel!r}")

    def builds(self, kernels: tuple[str, ...] | None = None) -> list[Callable[[], Any]]:
        """One call per part (or per part holding one of ``kernels``) that compiles it now,
        for a thread pool: NVRTC releases the GIL. CuPy's RawModule compiles lazily, so
        ``compile`` is asked for."""
        return [functools.partial(_build, self.name, part) for part in self.parts
                if kernels is None or set(kernels) & set(part)]


def _build(name: str, names: tuple[str, ...]) -> Any:
    module = _part(name, names)
    module.compile()
    return module


@functools.cache
def cached_module(name: str, names: tuple[str, ...] = ()) -> KernelModule:
    """``name``'s kernels (template instantiations ``names``; extern "C" kernels need none)
    as a KernelModule: split into parts of at most SPLIT_NAMES, each compiled by
    ``compile_module`` once per process, on first use or by the prebuild."""
    return KernelModule(name, split_names(names))


# What CuPy's RawModule gives every module besides ours (cupy.cuda.compiler appends
# -ftz=true): an arch-specific build must round as the rest do, or the same order would
# give other bits around denormals.
CUPY_IMPLIED_OPTIONS = ("-ftz=true",)


def _nvrtc() -> Any:
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError:  # older layouts
        from cupy.cuda import nvrtc
    return nvrtc


def kernel_cache_dir() -> Path:
    """Where the sm_90a cubins are kept: ``~/.cache/crucible/kernels``, beside CuPy's own
    cache rather than in it (CuPy 14 keeps no public accessor for its directory)."""
    return Path.home() / ".cache" / "crucible" / "kernels"


@functools.cache
def cached_arch_module(name: str, arch: str) -> Any:
    """``name`` built by NVRTC for an arch-specific target (``sm_90a``: wgmma needs it, and
    CuPy's RawModule always sets its own -arch), with the project's options and CuPy's
    implied ones, straight to a cubin; kept under ``kernel_cache_dir()`` by a digest of the
    source (headers included), the options and NVRTC's version, and loaded as a RawModule.
    Once per process per source. A build error is a RuntimeError with NVRTC's log."""
    import os
    import tempfile

    import cupy

    nvrtc = _nvrtc()
    src = module_source(name)
    options = ("-std=c++17", f"-I{cuda_source_dir()}", f"-arch={arch}") + CUPY_IMPLIED_OPTIONS
    key = hashlib.sha256(repr((src, options, nvrtc.getVersion())).encode()).hexdigest()
    cache = kernel_cache_dir()
    path = cache / f"crucible-{Path(name).stem}-{arch}-{key[:32]}.cubin"
    if not path.exists():
        prog = nvrtc.createProgram(src, name, (), ())
        try:
            try:
                nvrtc.compileProgram(prog, options)
            except nvrtc.NVRTCError as e:
                raise RuntimeError(f"NVRTC could not build {name} for {arch}:\n"
                                   f"{nvrtc.getProgramLog(prog)[-4000:]}") from e
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)  # atomic: a concurrent process reads the whole file or none
    return cupy.RawModule(path=str(path))
