"""``cupy_route.first_use`` on the host: it must say True exactly where ``_route`` would
capture a graph or run a step eagerly for want of one (the engine then collects the step
in flight first, tests/test_engine_first_use.py), in ``_route``'s order: decode graphs,
lone prefills (unfed), mixed graphs. The graph caches are built without a device, as in
tests/test_mixed_graph_meta.py; a graph is any object under its key."""

from __future__ import annotations

from types import SimpleNamespace

from crucible.backend.cupy_graphs import BUCKETS, DecodeGraphs
from crucible.backend.cupy_mixed_graphs import MixedGraphs
from crucible.backend.cupy_prefill_graphs import PrefillGraphs
from crucible.backend.cupy_route import first_use
from crucible.kernels.variants import score_capacity
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch


def backend(max_graphs: int = 4) -> SimpleNamespace:
    d = DecodeGraphs.__new__(DecodeGraphs)  # host side only: no device, no stream
    d.graphs, d.ceiling = {}, 8192
    p = PrefillGraphs.__new__(PrefillGraphs)
    p.graphs, p.max_graphs, p.classes = {}, max_graphs, None
    m = MixedGraphs.__new__(MixedGraphs)
    m.graphs, m.max_graphs, m.max_tokens, m.classes = {}, max_graphs, 1024, None
    return SimpleNamespace(graphs=d, prefill_graphs=p, mixed_graphs=m,
                           variant=SimpleNamespace(family="exact"))


def step(*slices: tuple[int, int], final: bool = True) -> PackedBatch:
    """One segment per (start, rows); each samples its last row unless ``final`` is False."""
    specs = [SegmentSpec(f"r{i}", [5] * n, s, list(range(100 * i, 100 * i + (s + n + 15) // 16)),
                         [n - 1] if final or n == 1 else [])
             for i, (s, n) in enumerate(slices)]
    return build_packed_batch(specs)


def test_decode_steps_are_new_until_their_pair_is_held() -> None:
    be = backend()
    b = step((40, 1), (90, 1), (7, 1))
    assert first_use(be, b, fed=True)
    bucket = next(x for x in BUCKETS if x >= 3)
    be.graphs.graphs[(bucket, be.graphs.capacity_class(score_capacity(b.max_end), bucket))] = 1
    assert not first_use(be, b, fed=True) and not first_use(be, b, fed=False)
    # A longer history past the held pair's capacity class is a new pair again.
    assert first_use(be, step((40, 1), (90, 1), (3000, 1)), fed=True)


def test_mixed_steps_are_new_until_their_key_is_held_or_the_cache_is_full() -> None:
    be = backend(max_graphs=2)
    m = be.mixed_graphs
    a, b = step((0, 1), (300, 60), (40, 1)), step((0, 1), (300, 61), (700, 30))
    assert m.key(a) != m.key(b) and m.key(b) is m.key(b)  # the second ask is the memo
    assert first_use(be, a, fed=True) and first_use(be, b, fed=False)
    m.graphs[m.key(a)] = 1
    assert not first_use(be, a, fed=True) and first_use(be, b, fed=True)
    m.graphs[("another",)] = 1  # full: b runs eagerly for good, no first use to wait for
    assert not first_use(be, b, fed=True)


def test_lone_prefills_take_a_prefill_graph_or_else_a_mixed_one() -> None:
    be = backend()
    p, m = be.prefill_graphs, be.mixed_graphs
    lone = step((0, 200))
    assert first_use(be, lone, fed=False)  # neither kind holds it
    m.graphs[m.key(lone)] = 1  # a prefill graph's first sighting falls to the mixed graph
    assert not first_use(be, lone, fed=False)
    m.graphs.clear()
    p.graphs[p.key(lone, score_capacity(lone.max_end))] = 1
    assert not first_use(be, lone, fed=False)
    # Fed, a lone prefill skips the prefill graphs (they take no feed): the mixed graph's.
    assert first_use(be, lone, fed=True)
    # A prefill whose last row does not sample is another key.
    assert first_use(be, step((0, 200), final=False), fed=False)


def test_without_graphs_nothing_is_a_first_use() -> None:
    be = SimpleNamespace(graphs=None, prefill_graphs=None, mixed_graphs=None,
                         variant=SimpleNamespace(family="exact"))
    for b in (step((3, 1)), step((0, 50)), step((0, 1), (10, 20))):
        assert not first_use(be, b, fed=False)
    online = backend()  # the online family has no mixed graphs: those steps run eagerly
    online.variant = SimpleNamespace(family="online")
    assert not first_use(online, step((0, 1), (10, 20)), fed=True)
