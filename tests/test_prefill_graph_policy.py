"""The singleton prefill graphs' capture policy, host side only (no device): a key is
captured the second time it is seen, at most MAX_GRAPHS are kept, and a full cache runs
new keys eagerly; the sightings are bounded too."""

from __future__ import annotations

import sys
import types
from collections import OrderedDict

import numpy as np
import pytest

from crucible.backend import cupy_graph_cache as cgc
from crucible.backend import cupy_prefill_graphs as cpg
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch


def _graphs(monkeypatch: pytest.MonkeyPatch, captured: list[int]) -> cpg.PrefillGraphs:
    fake = types.ModuleType("cupy")
    fake.asarray = np.asarray
    fake.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    monkeypatch.setitem(sys.modules, "cupy", fake)

    class Cap:
        seconds = 0.05  # the host time a capture took

        def replay(self, stream: object, meta: np.ndarray, ring: object) -> str:
            return "logits"

    def capture(forward: object, stream: object, meta_dev: object, meta: object,
                memory: object, wait: bool = True) -> Cap:
        assert wait is False  # replayed on the capture stream, behind the warm-up
        captured.append(meta.num_rows)
        return Cap()

    monkeypatch.setattr(cpg, "capture_forward", capture)
    g = cpg.PrefillGraphs.__new__(cpg.PrefillGraphs)  # no stream, no page-locked ring
    g.width, g.scratch, g.stream, g.ring = 8, 99, None, None
    g.graphs, g.seen, g.num_captures, g.num_replays, g.num_eager = OrderedDict(), {}, 0, 0, 0
    g.num_out_of_memory, g.capture_s, g.has_room = 0, 0.0, None
    g.capture_after, g.max_graphs = cpg.CAPTURE_AFTER, cpg.MAX_GRAPHS
    g.memory = types.SimpleNamespace(release=lambda: None)  # what the graphs share
    return g


def _prompt(n: int) -> PackedBatch:
    return build_packed_batch([SegmentSpec("p", [5] * n, 0, list(range(8)), [n - 1])])


def test_a_length_is_captured_on_its_second_sighting(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[int] = []
    g = _graphs(monkeypatch, captured)
    got = [g.run(_prompt(n), 256, None) for n in (40, 41, 40, 40, 42, 41)]
    # 40: eager, capture, replay; 41: eager, capture; 42: eager.
    assert got == [None, None, "logits", "logits", None, "logits"]
    assert captured == [40, 41] and g.num_captures == 2 and g.num_replays == 3
    assert g.capture_s == pytest.approx(0.1)  # each capture's host time, summed
    assert g.num_eager == 3 and list(g.seen) == [(42, True, 256)]  # captured keys leave


def test_full_cache_and_bounded_sightings(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[int] = []
    g = _graphs(monkeypatch, captured)
    g.max_graphs = 2
    monkeypatch.setattr(cgc, "MAX_SEEN", 3)
    for n in (10, 10, 11, 11, 12, 12):  # the third key finds the cache full: eager
        g.run(_prompt(n), 256, None)
    assert captured == [10, 11] and g.num_eager == 4 and len(g.graphs) == 2
    for n in (13, 14, 15, 16):  # sightings past MAX_SEEN start over instead of growing
        g.run(_prompt(n), 256, None)
    assert len(g.seen) <= 3
    g.capture_after, g.max_graphs = 1, 10  # the checks' policy: every key on sight
    assert g.run(_prompt(20), 256, None) == "logits" and captured[-1] == 20


def test_out_of_memory_runs_the_step_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that finds no device memory drops every prefill graph (their pools go back
    to the device) and the step runs eagerly; later keys capture again, up to half as many
    graphs as were held."""
    captured: list[int] = []
    g = _graphs(monkeypatch, captured)
    g.stream = types.SimpleNamespace(synchronize=lambda: None)
    g.capture_after = 1
    for n in (30, 32):
        assert g.run(_prompt(n), 256, None) == "logits"
    assert len(g.graphs) == 2
    real = cpg.capture_forward

    def no_room(*a: object, **k: object) -> object:
        raise MemoryError("out of memory")

    monkeypatch.setattr(cpg, "capture_forward", no_room)
    assert g.run(_prompt(31), 256, None) is None
    assert g.graphs == {} and g.num_out_of_memory == 1 and g.num_eager == 1
    assert g.max_graphs == 1  # two fitted: one from now on
    monkeypatch.setattr(cpg, "capture_forward", real)
    assert g.run(_prompt(31), 256, None) == "logits" and captured == [30, 32, 31]
    assert g.run(_prompt(33), 256, None) is None and captured == [30, 32, 31]  # full: eager
