"""Capacity classes on the GPU (skipped without CuPy and a GPU; crucible/kernels/capacity.py):
the driver's occupancy query answers on any thread, and gives the same classes there as on
the thread that loaded the kernels.

Why: an AsyncLLMEngine steps its engine on a thread of its own, and the first mixed graph key
is made there; a driver call on a thread with no current context fails (CUresult 201), which
killed the chat bench's engine on an H100 (2026-12-05) until capacity._occupancy made the
device's primary context current first."""

from __future__ import annotations

import threading

import pytest

from crucible.kernels import capacity
from crucible.kernels.variants import parse_variant

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def classes_of(c: capacity.CapacityClasses) -> tuple:
    return (tuple(c.decode(x, 64) for x in (300, 1100, 2100, 3000)),
            tuple(c.slices(x, 128, 16) for x in (900, 1100, 1500, 2100)))


def test_classes_are_the_same_on_a_thread_that_never_touched_the_runtime() -> None:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device")
    variant = parse_variant("exact-q4-k64")
    got: dict = {}

    def fresh() -> None:
        try:  # new classes: nothing cached from this thread's lookups
            got["classes"] = classes_of(capacity.device_classes(9, 3, variant, 8192))
        except Exception as e:  # noqa: BLE001 (reported in the main thread below)
            got["error"] = e

    t = threading.Thread(target=fresh)  # first: its kernels' attributes set there
    t.start()
    t.join()
    assert "error" not in got, got.get("error")
    here = classes_of(capacity.device_classes(9, 3, variant, 8192))
    assert got["classes"] == here
    assert all(c >= x for c, x in zip(here[0], (300, 1100, 2100, 3000)))
