"""How the steps ran, counted: each backend's graph_stats (GRAPH_STATS), carried in the
engine's stats and rendered by /metrics as crucible_graph_* series."""

from __future__ import annotations

from types import SimpleNamespace as NS

from crucible.backend.cupy_route import graph_stats
from crucible.backend.numpy_backend import NumpyBackend
from crucible.backend.protocol import GRAPH_STATS
from crucible.server.metrics import Metrics
from crucible.server.probe import parse_metrics


def test_cupy_counts_every_graph_kind() -> None:
    """Replays per kind; captures of every kind; capture ms of the on-demand kinds only
    (the decode graphs' are start-up's, reported there); a kind that is off counts 0."""
    be = NS(graphs=NS(num_replays=50, num_captures=38, capture_s=9.0),
            prefill_graphs=NS(num_replays=4, num_captures=2, capture_s=0.0304),
            mixed_graphs=NS(num_replays=741, num_captures=23, capture_s=1.1728))
    assert graph_stats(be) == {"graph_decode_replays": 50, "graph_prefill_replays": 4,
                               "graph_mixed_replays": 741, "graph_captures": 63,
                               "graph_capture_ms": 1203, "graph_memory_drops": 0,
                               "graph_memory_retries": 0, "graph_memory_bytes": 0}
    be.memory = NS(num_dropped=12, num_retries=1)  # the memory guard's (cupy_memory.py)
    assert graph_stats(be)["graph_memory_drops"] == 12
    assert graph_stats(be)["graph_memory_retries"] == 1
    # each kind's shared memory (cupy_graph_memory.py), summed over the kinds that have it
    be.graphs.memory, be.mixed_graphs.memory = NS(nbytes=300 << 20), NS(nbytes=5 << 20)
    assert graph_stats(be)["graph_memory_bytes"] == 305 << 20
    be.memory = None
    be.prefill_graphs = be.mixed_graphs = None
    assert graph_stats(be) == {"graph_decode_replays": 50, "graph_prefill_replays": 0,
                               "graph_mixed_replays": 0, "graph_captures": 38,
                               "graph_capture_ms": 0, "graph_memory_drops": 0,
                               "graph_memory_retries": 0, "graph_memory_bytes": 300 << 20}
    assert tuple(graph_stats(be)) == GRAPH_STATS


def test_numpy_backend_has_none() -> None:
    assert NumpyBackend().graph_stats() == dict.fromkeys(GRAPH_STATS, 0)


def test_engine_stats_carry_them() -> None:
    from crucible import LLM, SamplingParams

    llm = LLM(model="tiny-random", device="cpu", num_pages=64)
    llm.generate(["a b c"], SamplingParams(max_tokens=3, temperature=0))
    st = llm.engine.stats()
    assert {k: st[k] for k in GRAPH_STATS} == dict.fromkeys(GRAPH_STATS, 0)
    assert st["steps"] == 3  # every one of them eager on the CPU


def test_metrics_render_them() -> None:
    stats = {"graph_decode_replays": 7, "graph_prefill_replays": 0,
             "graph_mixed_replays": 5, "graph_captures": 3, "graph_capture_ms": 1500,
             "graph_memory_drops": 4, "graph_memory_retries": 2, "graph_memory_bytes": 3 << 28}
    text = Metrics().render(stats, healthy=True, queue_bound=8)
    m = parse_metrics(text)
    assert m['crucible_graph_replays_total{kind="decode"}'] == 7
    assert m['crucible_graph_replays_total{kind="prefill"}'] == 0
    assert m['crucible_graph_replays_total{kind="mixed"}'] == 5
    assert m["crucible_graph_captures_total"] == 3
    assert m["crucible_graph_capture_seconds_total"] == 1.5
    assert m["crucible_graph_memory_drops_total"] == 4
    assert m["crucible_graph_memory_retries_total"] == 2
    assert m["crucible_graph_memory_bytes"] == 3 << 28
    assert "# TYPE crucible_graph_memory_bytes gauge" in text
    assert text.count("# TYPE crucible_graph_replays_total counter") == 1
