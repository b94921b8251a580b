"""A stand-in for CuPy on a machine without a GPU, for timing the CuPy backend's own Python
(bench/eager_host.py): arrays are numpy arrays posing as device ones (``data.ptr``, ``get``),
kernels count their launches and do nothing, device queries answer with an H200's figures.
What it cannot time is CuPy's own cost per call (a launch ~7.4 us on the H200, allocations
from its memory pool), which comes on top on a real device."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np


class Dev(np.ndarray):
    """A host array posing as a device one."""

    def __new__(cls, shape: tuple, dtype: type = np.float32, memptr: object = None) -> "Dev":
        return np.empty(shape, dtype).view(cls)  # cp.ndarray(shape, dtype, memptr=...)

    @property
    def data(self) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self) -> np.ndarray:
        return np.asarray(self)


def _empty(shape: tuple, dtype: type = np.float32) -> Dev:
    return np.empty(shape, dtype).view(Dev)


def _asarray(a: object, dtype: type | None = None) -> Dev:
    return np.ascontiguousarray(np.asarray(a, dtype)).view(Dev)


class _Kernel:
    """Every kernel: its launches are counted, nothing runs."""

    shared_size_bytes = 0
    max_dynamic_shared_size_bytes = 0
    calls = 0

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        _Kernel.calls += 1


class _Module:
    def get_function(self, name: str) -> _Kernel:
        return _Kernel()

    def compile(self) -> None:  # the start-up prebuild asks every module to build now
        pass


class _Stream:
    ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def synchronize(self):
        pass

    def wait_event(self, event: object) -> None:
        pass

    def is_capturing(self) -> bool:
        return False


def launches() -> int:
    return _Kernel.calls


def install() -> types.ModuleType:
    """Put the stand-in in ``sys.modules["cupy"]`` and make the kernel sources "compile" to
    it (call before anything imports CuPy)."""
    fake = types.ModuleType("cupy")
    for n in ("float32", "int32", "uint32", "int8", "uint16", "int64", "uint64", "float64", "uint8"):
        setattr(fake, n, getattr(np, n))
    fake.empty = _empty
    fake.zeros = lambda shape, dtype=np.float32: np.zeros(shape, dtype).view(Dev)
    fake.full = lambda shape, v, dtype=np.float32: np.full(shape, v, dtype).view(Dev)
    fake.asarray = _asarray
    fake.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(Dev)
    fake.ndarray = Dev
    fake.asnumpy = lambda a: np.asarray(a)
    attrs = {16: 132, 38: 50 * 2**20, 97: 227 * 1024}
    rt = SimpleNamespace(getDevice=lambda: 0, deviceGetAttribute=lambda a, d: attrs.get(a, 0),
                         memGetInfo=lambda: (140 * 2**30, 141 * 2**30),
                         getDeviceProperties=lambda d: {"name": b"fake"},
                         memsetAsync=lambda *a: None, setDevice=lambda d: None)
    fake.cuda = SimpleNamespace(
        runtime=rt, get_current_stream=lambda: _Stream(), Stream=lambda **k: _Stream(),
        Device=lambda *a: SimpleNamespace(synchronize=lambda: None, compute_capability="90",
                                          id=0, use=lambda: None),
        Event=lambda **k: SimpleNamespace(record=lambda *a: None, synchronize=lambda: None))
    fake.get_default_memory_pool = lambda: SimpleNamespace(
        malloc=lambda n: None, free_all_blocks=lambda: None, used_bytes=lambda: 0)
    fake.RawModule = lambda **k: _Module()
    fake.RawKernel = lambda *a, **k: _Kernel()
    sys.modules["cupy"] = fake
    from crucible.kernels import source
    source.compile_module = lambda name, names=(): _Module()
    source.cached_arch_module = lambda name, arch: _Module()  # the sm_90a builds (wgmma)
    return fake
