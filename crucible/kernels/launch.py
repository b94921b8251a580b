"""Kernel launches with programmatic dependent launch (PDL) inside captured decode graphs.

Why: a batch-1 decode step is ~150 small kernels, each latency-bound. With PDL (Hopper,
CUDA 12.3+) a kernel may start while the one before it is still running: its CTAs load
what no earlier kernel of the step writes (weights, scales, RoPE tables, step metadata,
K/V history), then wait in ``griddepcontrol.wait`` (cuda/pdl.cuh) for the previous grid to
finish and flush before reading activations. The arithmetic is untouched, so the bits are
the same as a plain launch; only the overlap changes.

CuPy launches through cuLaunchKernel, which takes no launch attributes, so PDL launches go
through the driver's cuLaunchKernelEx (ctypes). They are used only on a non-default
stream (graph capture runs on the decode graphs' own stream); eager steps on the default
stream launch as before, where ``griddepcontrol.wait`` returns at once.

Whether to use it is the caller's: ``launch(..., pdl=True)``; the wrappers take ``pdl`` and
pass it down, and the CuPy backend passes its ``BackendOptions.pdl`` (``CRUCIBLE_PDL=0``
turns it off: a benchmark A/B, or a driver that refuses it). No module state decides it. If
the driver lacks cuLaunchKernelEx the launches fall back to plain ones; ``status()`` says why.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any

import numpy as np

_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_..., cuda.h


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


_driver_error = {"reason": ""}  # why cuLaunchKernelEx could not be loaded (``status``)


def status() -> dict[str, Any]:
    """Whether the driver offers PDL launches, and if not, why."""
    return {"available": _driver() is not None, "reason": _driver_error["reason"]}


@functools.cache
def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernelEx
    except (OSError, AttributeError) as e:
        _driver_error["reason"] = f"cuLaunchKernelEx unavailable: {e}"
        return None
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                   ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


# Each argument's bytes in an 8-byte slot of one buffer (the driver reads a parameter's own
# size from its pointer): one pack and two ctypes objects a launch, where a ctypes value per
# argument made a capture's ~450 launches cost ~30 us each, twice an eager step's host time
# (bench/capture-parts-h100.json).
_SLOT = {np.dtype(np.int32): "i4x", np.dtype(np.int64): "q", np.dtype(np.uint64): "Q",
         np.dtype(np.float32): "f4x", np.dtype(np.uint32): "I4x"}


def slots(args: tuple) -> tuple[str, list]:
    """(struct format, values) of a launch's arguments in 8-byte slots: a device pointer
    for an array, the scalar's own width for a numpy scalar (as CuPy itself passes them)."""
    fmt, values = ["<"], []
    for a in args:
        data = getattr(a, "data", None)
        if hasattr(data, "ptr"):  # a CuPy array
            fmt.append("Q")
            values.append(int(data.ptr))
        elif isinstance(a, np.generic) and a.dtype in _SLOT:
            fmt.append(_SLOT[a.dtype])
            values.append(a.item())
        else:
            raise TypeError(f"PDL launch: unsupported kernel argument {type(a).__name__}")
    return "".join(fmt), values


def _pack(args: tuple) -> tuple[Any, Any]:
    """(the buffer holding every argument, the array of pointers into it) for
    cuLaunchKernelEx, 8 bytes apart (``slots``)."""
    fmt, values = slots(args)
    buf = ctypes.create_string_buffer(struct.pack(fmt, *values), 8 * len(args))
    base = ctypes.addressof(buf)
    return buf, (ctypes.c_void_p * len(args))(*range(base, base + 8 * len(args), 8))


@functools.lru_cache(maxsize=1024)
def _config(grid: tuple[int, ...], block: tuple[int, ...], smem: int, stream: int) -> _Config:
    """The launch's config, made once per shape and stream (the driver only reads it)."""
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    return _Config((ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), smem,
                   ctypes.c_void_p(stream), ctypes.pointer(_PDL_ATTR), 1)


_PDL_ATTR = _Attr(_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
_PDL_ATTR.value[0] = 1  # programmaticStreamSerializationAllowed


def launch(fn: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
           shared_mem: int = 0, *, pdl: bool = False) -> None:
    """``fn(grid, block, args, shared_mem=...)``, as a PDL launch when ``pdl`` and the
    current stream is not the default one (and the driver offers it)."""
    if not pdl:  # the plain launch; no stream lookup on the eager path
        fn(grid, block, args, shared_mem=shared_mem)
        return
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    ex = _driver() if stream.ptr != 0 else None
    if ex is None:
        fn(grid, block, args, shared_mem=shared_mem)
        return
    cfg = _config(tuple(grid), tuple(block), int(shared_mem), int(stream.ptr))
    _buf, ptrs = _pack(args)  # the buffer must outlive the call
    func = getattr(fn, "kernel", fn)  # RawKernel -> its loaded cupy.cuda.function.Function
    rc = ex(ctypes.byref(cfg), ctypes.c_void_p(int(func.ptr)), ptrs, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {rc} (set CRUCIBLE_PDL=0 "
                           "to launch without programmatic dependent launch)")
