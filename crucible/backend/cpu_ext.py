"""The compiled CPU kernels (``crucible.backend._cpu``): loading, fallback notice, threads.

The extension is built by ``pip install`` (setup.py) when a C compiler is present. A
source checkout used through PYTHONPATH without a build has no extension; the numpy
backend then falls back to its BLAS tile path and says so once. The two paths give
different CPU bits (each is batch-invariant on its own; docs/numerics.md).

``CRUCIBLE_CPU_THREADS`` sets how many threads the kernels use (default: the cores this
process may run on, a container's CPU quota included: cores.py). Threads split output
columns or rows, never a reduction, so the setting changes speed only, never a bit.
"""

from __future__ import annotations

import logging
from types import ModuleType

from crucible.backend.cores import available_cores
from crucible.errors import ConfigError

MAX_THREADS = 256  # the pool's limit (pool.c: 255 workers + the caller)
log = logging.getLogger("crucible.backend")

try:
    from crucible.backend import _cpu as _ext
    _import_error: str | None = None
except ImportError as e:  # not built: a plain source checkout, or no compiler at install
    _ext = None
    _import_error = str(e)
_warned = False


def extension() -> ModuleType | None:
    """The compiled module, or None when it is not built."""
    return _ext


def kernel_name(scalar: bool = False) -> str:
    """What the CPU GEMMs run on: 'avx2', 'scalar' (compiled, portable) or 'blas-tiles'."""
    if _ext is None:
        return "blas-tiles"
    return "avx2" if _ext.have_avx2() and not scalar else "scalar"


def announce_fallback() -> None:
    """Say once per process that the compiled kernels are missing, and what that costs."""
    global _warned
    if _warned:
        return
    _warned = True
    log.warning("crucible: compiled CPU kernels not built (%s); the numpy backend uses its "
                "slower BLAS tile path. Build them with: pip install -e .",
                _import_error or "switched off")


def default_threads() -> int:
    """The cores this process may use: its affinity, capped by a container's CPU quota."""
    return available_cores()


def check_threads(threads: int | None) -> int:
    """Threads for the CPU kernels: ``threads``, or the available cores when None."""
    if threads is None:
        return min(default_threads(), MAX_THREADS)
    if isinstance(threads, bool) or not isinstance(threads, int) \
            or not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"cpu threads must be a whole number from 1 to {MAX_THREADS}, "
                          f"got {threads!r}")
    return threads
