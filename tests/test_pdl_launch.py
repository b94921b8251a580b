"""Programmatic dependent launch (crucible/kernels/launch.py), checked on the CPU with a
stand-in cupy and a stand-in driver entry point: which launches use it, and the exact C
structures and argument values they hand to cuLaunchKernelEx. Whether the GPU keeps the
bits is gpu-graph-check's job (graph replays == eager steps, bitwise)."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from crucible.kernels import launch as launcher


class _Data:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _Array:  # the part of a CuPy array a launch reads
    def __init__(self, ptr: int) -> None:
        self.data = _Data(ptr)


class _Kernel:
    def __init__(self) -> None:
        self.kernel = types.SimpleNamespace(ptr=0xF00D)
        self.calls: list[tuple] = []

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        self.calls.append((grid, block, args, shared_mem))


def _fake_cupy(monkeypatch: pytest.MonkeyPatch, stream_ptr: int) -> None:
    fake = types.ModuleType("cupy")
    stream = types.SimpleNamespace(ptr=stream_ptr)
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: stream)
    monkeypatch.setitem(sys.modules, "cupy", fake)


def _fake_driver(monkeypatch: pytest.MonkeyPatch, rc: int = 0) -> list[dict]:
    seen: list[dict] = []

    def ex(cfg_ref, func, params, extra) -> int:  # noqa: ANN001 (ctypes values)
        cfg = ctypes.cast(cfg_ref, ctypes.POINTER(launcher._Config)).contents
        attr = cfg.attrs[0]
        vals = [params[0], params[1], params[2], params[3]]
        seen.append({
            "grid": list(cfg.grid), "block": list(cfg.block), "smem": cfg.smem,
            "stream": cfg.stream, "num_attrs": cfg.num_attrs, "attr_id": attr.id,
            "attr_value": attr.value[0], "func": func.value, "extra": extra,
            "args": (ctypes.cast(vals[0], ctypes.POINTER(ctypes.c_void_p)).contents.value,
                     ctypes.cast(vals[1], ctypes.POINTER(ctypes.c_int32)).contents.value,
                     ctypes.cast(vals[2], ctypes.POINTER(ctypes.c_float)).contents.value,
                     ctypes.cast(vals[3], ctypes.POINTER(ctypes.c_uint64)).contents.value)})
        return rc

    monkeypatch.setattr(launcher, "_driver", lambda: ex)
    return seen


ARGS = (_Array(0x1000), np.int32(-7), np.float32(0.5), np.uint64(0))


def test_default_stream_launches_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cupy(monkeypatch, stream_ptr=0)
    seen = _fake_driver(monkeypatch)
    k = _Kernel()
    launcher.launch(k, (3, 2), (32, 9), ARGS, shared_mem=64, pdl=True)
    assert k.calls == [((3, 2), (32, 9), ARGS, 64)] and seen == []


def test_graph_stream_launch_carries_the_pdl_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cupy(monkeypatch, stream_ptr=0xABC)
    seen = _fake_driver(monkeypatch)
    k = _Kernel()
    launcher.launch(k, (3, 2), (32, 9), ARGS, shared_mem=64, pdl=True)
    assert k.calls == []
    assert seen == [{"grid": [3, 2, 1], "block": [32, 9, 1], "smem": 64, "stream": 0xABC,
                     "num_attrs": 1, "attr_id": 6, "attr_value": 1, "func": 0xF00D,
                     "extra": None, "args": (0x1000, -7, 0.5, 0)}]


def test_disabled_or_unavailable_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """pdl=False (the default too) never calls the driver, even on a graph's stream; pdl=True
    without cuLaunchKernelEx launches plainly."""
    _fake_cupy(monkeypatch, stream_ptr=0xABC)
    seen = _fake_driver(monkeypatch)
    k = _Kernel()
    launcher.launch(k, (1,), (256,), ARGS, pdl=False)
    launcher.launch(k, (1,), (256,), ARGS)
    monkeypatch.setattr(launcher, "_driver", lambda: None)
    launcher.launch(k, (1,), (256,), ARGS, pdl=True)
    assert len(k.calls) == 3 and seen == []


def test_status_reports_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_driver", lambda: None)
    assert launcher.status()["available"] is False and "enabled" not in launcher.status()


def test_driver_error_is_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cupy(monkeypatch, stream_ptr=0xABC)
    _fake_driver(monkeypatch, rc=1)
    with pytest.raises(RuntimeError, match="CUresult 1.*CRUCIBLE_PDL=0"):
        launcher.launch(_Kernel(), (1,), (32,), ARGS, pdl=True)


def test_unsupported_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="unsupported kernel argument float"):
        launcher._pack((np.int32(1), 1.5))


def test_every_argument_kind_reads_back_at_its_pointer() -> None:
    """Each value sits at its own pointer in the C type the kernel's parameter has, the
    extremes of each width included (a sign or a high word lost would show)."""
    kinds = ((_Array(0xFFFF_FFFF_FFFF_FFF0), ctypes.c_uint64, 0xFFFF_FFFF_FFFF_FFF0),
             (np.int32(-2**31), ctypes.c_int32, -2**31), (np.int32(7), ctypes.c_int32, 7),
             (np.uint32(2**32 - 1), ctypes.c_uint32, 2**32 - 1),
             (np.int64(-3), ctypes.c_int64, -3), (np.uint64(2**64 - 1), ctypes.c_uint64, 2**64 - 1),
             (np.float32(-0.1), ctypes.c_float, float(np.float32(-0.1))))
    buf, ptrs = launcher._pack(tuple(a for a, _, _ in kinds))
    assert len(ptrs) == len(kinds)
    for p, (_, ctype, want) in zip(ptrs, kinds):
        assert ctypes.cast(p, ctypes.POINTER(ctype)).contents.value == want
    # Negative control: read as 64 bits the int32 loses its sign (the slot is zero-padded).
    got = ctypes.cast(ptrs[1], ctypes.POINTER(ctypes.c_int64)).contents.value
    assert got != -2**31


def test_struct_layout_matches_cuda_h() -> None:
    # CUlaunchAttribute: 4-byte id, 4 bytes of padding, 64-byte value union.
    assert ctypes.sizeof(launcher._Attr) == 72
    assert launcher._Attr.value.offset == 8
    # CUlaunchConfig: seven uints, then the stream, attrs pointer and count (8-aligned).
    assert launcher._Config.stream.offset == 32
    assert launcher._Config.attrs.offset == 40
    assert launcher._Config.num_attrs.offset == 48


