"""Which way a step runs on the CuPy backend (crucible/backend/cupy_route.py), on the host:
fake graphs record what they were offered, and ``device_meta`` is replaced by a recorder, so
no GPU is needed. A fed step must reach a decode graph or the eager forward with its feed
and the decode graphs' latest ids buffer, never a prefill or mixed graph (they take no
feed); an unfed mixed step tries the mixed graphs first."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from crucible.backend import cupy_route
from crucible.step.batch import SegmentSpec, build_packed_batch


class Graphs:
    def __init__(self, name: str, takes: bool) -> None:
        self.name, self.takes, self.offered = name, takes, []
        self.fed, self.last, self.last_replayed = ("fed0", "fed1"), 1, True
        self.max_tokens = 512  # MixedGraphs' largest step (CRUCIBLE_MIXED_GRAPH_ROWS)

    def run(self, batch, forward, *args):
        self.offered.append((batch.num_rows, args))
        return f"{self.name} logits" if self.takes else None


def backend(takes: bool = True, mixed: bool = True):
    return SimpleNamespace(graphs=Graphs("decode", takes), prefill_graphs=Graphs("prefill", takes),
                           mixed_graphs=Graphs("mixed", takes) if mixed else None,
                           variant=SimpleNamespace(family="exact"), memory=None,
                           prepare=lambda batch: ("prepared", batch.num_rows))


def decode_batch(n: int):
    return build_packed_batch([SegmentSpec(f"r{i}", [0], 5 + i, [i], [0]) for i in range(n)])


def mixed_batch():
    return build_packed_batch([SegmentSpec("d", [0], 7, [0], [0]),
                               SegmentSpec("p", list(range(20)), 0, [1, 2], [19])])


@pytest.fixture
def metas(monkeypatch: pytest.MonkeyPatch) -> list:
    made: list = []

    def device_meta(batch, feed=None, fed=None):
        made.append((batch.num_rows, None if feed is None else feed.tolist(), fed))
        return ("meta", batch.num_rows)

    monkeypatch.setattr(cupy_route, "device_meta", device_meta)
    return made


def forward(meta):
    return ("eager", meta)


def test_a_fed_mixed_step_replays_a_mixed_graph_on_the_latest_ids(metas: list) -> None:
    be = backend()
    feed = np.array([3] + [-1] * 20, np.int32)
    assert cupy_route.run_step(be, mixed_batch(), forward, feed) == "mixed logits"
    (rows, (fed_feed, fed)), = be.mixed_graphs.offered
    assert rows == 21 and fed_feed is feed and fed == "fed1"  # fed[last]: the latest ids
    assert be.prefill_graphs.offered == [] and metas == []
    assert be.graphs.last == 1 and not be.graphs.last_replayed  # not flipped


def test_a_fed_step_no_graph_takes_runs_eagerly_on_the_latest_ids(metas: list) -> None:
    be = backend(takes=False)
    feed = np.array([3] + [-1] * 20, np.int32)
    assert cupy_route.run_step(be, mixed_batch(), forward, feed) == ("eager", ("meta", 21))
    assert metas == [(21, feed.tolist(), "fed1")]
    assert be.prefill_graphs.offered == []  # a prefill graph takes no feed


def test_a_fed_decode_step_replays_its_graph(metas: list) -> None:
    be = backend()
    assert cupy_route.run_step(be, decode_batch(3), forward, np.arange(3)) == "decode logits"
    assert [r for r, _ in be.graphs.offered] == [3] and metas == []


def test_unfed_steps_try_their_graphs_then_run_eagerly(metas: list) -> None:
    be = backend()
    assert cupy_route.run_step(be, mixed_batch(), forward) == "mixed logits"
    be = backend(takes=False)
    assert cupy_route.run_step(be, mixed_batch(), forward) == ("eager", ("prepared", 21))
    assert be.mixed_graphs.offered == [(21, ())] and metas == []


def test_fed_steps_need_the_decode_graphs() -> None:
    be = backend()
    be.graphs = None
    with pytest.raises(ValueError, match="decode graphs"):
        cupy_route.run_step(be, mixed_batch(), forward, np.zeros(21, np.int32))
    assert cupy_route.mixed_feed_rows(be) is None


def test_any_step_can_be_fed_with_the_decode_graphs() -> None:
    assert cupy_route.mixed_feed_rows(backend()) == 1
    assert cupy_route.mixed_feed_rows(backend(mixed=False)) == 1
