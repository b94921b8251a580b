"""Host time of one kernel launch: CuPy's ``RawKernel.__call__`` against the driver's
cuLaunchKernelEx called through ctypes (``launch_driver`` below: one struct pack into a
reused buffer, two ctypes objects), on an empty kernel with an eager stage's usual
arguments.

    python3 bench/launch_host.py [--launches 4000] [--rounds 5] [--json PATH]

Why: an eager forward of a large mixed step is bound by its host (~300 launches,
docs/throughput.md "Eager launches of large mixed steps"), and our wrappers' Python is only
~11 us of each launch's ~35-40 us there. This times the launch call alone, so the rest can
be split between CuPy's launch and the stages' allocations (bench/eager_host.py).

Each round times ``--launches`` launches of each way, alternating which goes first, each
after a device sync, on the default stream; figures are host us a launch, median and
min-max over rounds (H100, 2026-12-08: CuPy 8.56 us, the driver path 14.12:
``bench/launch-host-h100.json``). The kernel writes nothing, so both ways do the same GPU work; a
last check runs a kernel that stores its scalar arguments through both ways and compares.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import struct
import sys
import threading
import time
from typing import Any

import numpy as np
from common import stat, write_json

import crucible.kernels.launch as kl

SRC = r"""
extern "C" __global__ void empty(const float* a, const float* b, const float* c,
                                 const int* d, float* e, float* f, int n, int m,
                                 float s, long long t) {}
extern "C" __global__ void echo(float* out, int n, float s, long long t) {
    out[0] = (float)n; out[1] = s; out[2] = (float)t;
}
"""


@functools.lru_cache(maxsize=1024)
def _config(grid: tuple[int, ...], block: tuple[int, ...], smem: int, stream: int) -> Any:
    """A launch config without attributes, made once per shape."""
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    return kl._Config((ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), smem,
                      ctypes.c_void_p(stream), None, 0)


class _Slots(threading.local):
    """Per thread, one argument buffer and its pointer array per argument count: the driver
    copies a launch's parameters before cuLaunchKernelEx returns, so the next launch may
    overwrite them (no allocation a launch, unlike kernels.launch's PDL path)."""

    def __init__(self) -> None:
        self.by_count: dict[int, tuple[Any, Any]] = {}

    def get(self, n: int) -> tuple[Any, Any]:
        got = self.by_count.get(n)
        if got is None:
            buf = ctypes.create_string_buffer(8 * n)
            base = ctypes.addressof(buf)
            got = self.by_count[n] = (buf, (ctypes.c_void_p * n)(*range(base, base + 8 * n, 8)))
        return got


_SLOTS = _Slots()


def launch_driver(fn: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
                  shared_mem: int = 0, stream: int = 0) -> None:
    """A plain launch through cuLaunchKernelEx (kernels.launch's driver entry) on
    ``stream`` (0: the default stream), its arguments packed as kernels.launch packs a PDL
    launch's, into a reused buffer."""
    fmt, values = kl.slots(args)
    buf, ptrs = _SLOTS.get(len(args))
    struct.pack_into(fmt, buf, 0, *values)
    cfg = _config(tuple(grid), tuple(block), int(shared_mem), stream)
    rc = kl._driver()(ctypes.byref(cfg), ctypes.c_void_p(getattr(fn, "kernel", fn).ptr), ptrs,
                      None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {rc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import cupy as cp

    mod = cp.RawModule(code=SRC)
    empty, echo = mod.get_function("empty"), mod.get_function("echo")
    arrs = [cp.zeros(1024, cp.float32) for _ in range(3)] + [cp.zeros(1024, cp.int32)] + \
        [cp.zeros(1024, cp.float32) for _ in range(2)]
    kargs = (*arrs, np.int32(7), np.int32(9), np.float32(0.5), np.int64(3))
    grid, block = (132,), (256,)
    sync = cp.cuda.Device().synchronize

    def cupy_way() -> None:
        for _ in range(args.launches):
            empty(grid, block, kargs, shared_mem=0)

    def driver_way() -> None:
        for _ in range(args.launches):
            launch_driver(empty, grid, block, kargs, 0)

    ways = {"cupy": cupy_way, "driver": driver_way}
    us: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(args.rounds + 1):
        for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            sync()
            t = time.perf_counter()
            ways[name]()
            dt = (time.perf_counter() - t) / args.launches * 1e6
            sync()
            if r:  # round 0 warms up
                us[name].append(dt)
    out = cp.zeros(3, cp.float32)
    same = []
    for call in (lambda a: echo((1,), (1,), a), lambda a: launch_driver(echo, (1,), (1,), a)):
        out[:] = 0
        call((out, np.int32(11), np.float32(2.5), np.int64(-4)))
        same.append(out.get().tolist())
    res = {"launch_us": {k: stat(v) for k, v in us.items()},
           "driver_over_cupy": stat([d / c for d, c in zip(us["driver"], us["cupy"])]),
           "args_seen": same, "args_agree": same[0] == same[1] == [11.0, 2.5, -4.0]}
    print({k: v["median"] for k, v in res["launch_us"].items()}, "agree", res["args_agree"])
    if args.json:
        write_json(args.json, {"command": "python3 bench/launch_host.py "
                               + " ".join(argv if argv is not None else sys.argv[1:]), **res})
    return 0 if res["args_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
