"""The mixed-step graphs' metadata (backend/cupy_mixed_graphs.py), on the host: for random
mixed steps, every real row must see exactly what the eager step gives it (token, position,
K/V slot, its segment's start and page table up to its own causal end), padding rows only
the scratch page, and every entry past the step's must be empty. No GPU needed: the host
side of the graphs is plain numpy."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.backend.cupy_mixed_graphs import (
    MAX_SLICES,
    MAX_TOKENS,
    SLICE_CAPACITY_FLOOR,
    TILE,
    MixedGraphs,
    is_mixed_graph_step,
    tile_slots,
)
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch

SCRATCH = 9000


def graphs() -> MixedGraphs:
    g = MixedGraphs.__new__(MixedGraphs)  # host side only: no device, no stream
    g.width, g.scratch = 512, SCRATCH
    return g


def random_step(rng: np.random.Generator, max_tokens: int = MAX_TOKENS) -> PackedBatch:
    n_dec = int(rng.integers(0, 60 if max_tokens <= 512 else max_tokens - 128))
    n_pre = int(rng.integers(1, MAX_SLICES + 1))
    kinds = ["d"] * n_dec + ["p"] * n_pre
    rng.shuffle(kinds)  # decode rows and slices interleaved, as a scheduler may pack them
    specs, budget = [], max_tokens - n_dec
    for i, kind in enumerate(kinds):
        n = 1 if kind == "d" else int(rng.integers(2, max(3, budget // n_pre)))
        start = int(rng.integers(0, 3000))
        pages = rng.permutation(8000)[: (start + n + 15) // 16].tolist()
        finals = [0] if kind == "d" else ([n - 1] if rng.random() < 0.6 else [])
        specs.append(SegmentSpec(f"r{i}", rng.integers(0, 999, n).tolist(), start, pages,
                                 finals))
    return build_packed_batch(specs)


def decode(g: MixedGraphs, key: tuple, out: np.ndarray) -> dict:
    t, f, s, _, _, _ = key
    w, rows, sizes = g._sizes(key)
    offs = np.cumsum([0] + sizes)
    part = lambda k: out[offs[k] : offs[k + 1]]  # noqa: E731
    used = (out.size - offs[8]) // w
    return dict(tok=part(0), pos=part(1), page=part(2), slot=part(3),
                single=part(4).reshape(t, 4), multi=part(5).reshape(s, 4), finals=part(6),
                feed=part(7), tables=out[offs[8]:].reshape(used, w), w=w, rows=rows)


@pytest.mark.parametrize("seed", range(45))
def test_every_real_row_sees_its_eager_inputs(seed: int) -> None:
    # Seeds from 30: steps past 512 rows, as CRUCIBLE_MIXED_GRAPH_ROWS=1024 lets through;
    # from 40, past 1,024 (=2048).
    max_tokens = 2048 if seed >= 40 else 1024 if seed >= 30 else MAX_TOKENS
    rng = np.random.default_rng(seed)
    batch = random_step(rng, max_tokens)
    assert is_mixed_graph_step(batch, max_tokens)
    assert batch.num_rows <= MAX_TOKENS or not is_mixed_graph_step(batch)  # default 512
    g = graphs()
    key = g.key(batch)
    t, f, s, chunk, cap1, capm = key
    n, segs = batch.num_rows, batch.segments
    assert t >= n and f >= batch.final_rows.shape[0] and (s, chunk) == (tile_slots(t), TILE)
    assert cap1 % 256 == 0 and capm % 256 == 0
    feed = None
    if seed % 2:  # a pipelined step: some one-row segments read the previous step's ids
        feed = np.full(batch.num_rows, -1, np.int32)
        one = batch.segments[batch.segments[:, 1] == 1, 0]
        feed[one[::2]] = np.arange(one[::2].size, dtype=np.int32)
    m = decode(g, key, g.host_meta(batch, key, feed))
    want_feed = np.full(t, -1, np.int32)  # the row's own id unless fed; padding never fed
    if feed is not None:
        want_feed[:n] = feed
    assert (m["feed"] == want_feed).all()
    slots = batch.slot_mapping()
    assert (m["tok"][:n] == batch.token_ids).all() and (m["pos"][:n] == batch.positions).all()
    assert (m["page"][:n] == slots >> 4).all() and (m["slot"][:n] == slots & 15).all()
    assert (m["page"][n:] == SCRATCH).all() and (m["slot"][n:] == 0).all()
    assert (m["pos"][n:] == 0).all()
    # Each real row is covered by exactly one live entry, with its own start and pages.
    live = [(e, "single") for e in m["single"] if e[1] > 0]
    live += [(e, "multi") for e in m["multi"] if e[1] > 0]
    covered = np.zeros(t, int)
    for e, _ in live:
        covered[e[0] : e[0] + e[1]] += 1
    assert (covered == 1).all()  # real rows and padding rows, each once
    # A one-row segment is one entry; a slice is its tiles of TILE rows (the last one
    # first), each with the slice's pages and its own rows' absolute start.
    for k in range(segs.shape[0]):
        start, length, absolute, table = segs[k]
        mine = [(e, kind) for e, kind in live if start <= e[0] < start + length]
        assert all(kind == ("single" if length == 1 else "multi") for _, kind in mine)
        if length > 1:
            starts = [int(e[0]) for e, _ in mine]
            assert starts == list(range(start, start + length, TILE))[::-1]  # adjacent
        for e, _ in mine:
            assert e[1] == min(TILE, start + length - e[0])
            assert e[2] == absolute + e[0] - start
            need = -(-(e[2] + e[1]) // 16)  # the entry's longest causal length, in pages
            assert need <= m["w"]
            assert (m["tables"][e[3], :need] == batch.page_tables[table, :need]).all()
    # Padding rows: one-row entries at position 0 whose table is the scratch row.
    for e, kind in live:
        if e[0] >= n:
            assert e[1] == 1 and e[2] == 0 and m["tables"][e[3], 0] == SCRATCH
    assert (m["finals"][: batch.final_rows.shape[0]] == batch.final_rows).all()
    assert (m["finals"][batch.final_rows.shape[0] :] == 0).all()
    # Capacities bound every live entry's causal length (the kernels' score buffers).
    for e in m["single"][m["single"][:, 1] > 0]:
        assert e[2] + 1 <= cap1
    for e in m["multi"][m["multi"][:, 1] > 0]:
        assert e[2] + e[1] <= capm


def test_capture_stand_in_is_all_empty_on_the_scratch_page() -> None:
    g = graphs()
    key = (64, 16, 2, 32, 512, 1024)
    m = decode(g, key, g.host_meta(None, key))
    assert m["tables"].shape[0] == m["rows"]  # the stand-in fills every table row
    assert (m["single"][:, 1] == 0).all() and (m["multi"][:, 1] == 0).all()
    assert (m["page"] == SCRATCH).all() and (m["tables"] == SCRATCH).all()
    assert (m["feed"] == -1).all()  # no row reads fed_in's stale ids


def test_each_launch_gets_its_capacity() -> None:
    """The key's decode capacity is the step's longest history; the slices' capacity their
    own longest end, at least SLICE_CAPACITY_FLOOR, at most the decode one: a long decode
    history no longer sizes the slices' tiled launch (one CTA an SM past 1,024)."""
    def step(decode_start: int, slice_start: int, n: int = 100) -> PackedBatch:
        dec = [SegmentSpec(f"d{i}", [1], decode_start, list(range(200)), [0]) for i in range(8)]
        return build_packed_batch(dec + [SegmentSpec("p", [1] * n, slice_start,
                                                     list(range(200)), [n - 1])])

    key = MixedGraphs.key(graphs(), step(1500, 0))
    assert key[4:] == (2048, SLICE_CAPACITY_FLOOR)  # the slice ends at 100
    assert MixedGraphs.key(graphs(), step(1500, 1200))[4:] == (2048, 2048)
    assert MixedGraphs.key(graphs(), step(3000, 1200))[4:] == (4096, 2048)
    assert MixedGraphs.key(graphs(), step(100, 0))[4:] == (256, 256)  # never above decode's
    assert MixedGraphs.key(graphs(), step(600, 0))[4:] == (1024, 1024)


def test_steps_outside_the_graphs_run_eagerly() -> None:
    def step(lengths: list[int]) -> PackedBatch:
        return build_packed_batch([SegmentSpec(f"r{i}", [1] * n, 0, list(range(40)),
                                               [n - 1]) for i, n in enumerate(lengths)])

    assert is_mixed_graph_step(step([1, 1, 30]))
    assert not is_mixed_graph_step(step([1, 1, 1]))  # a decode step: the decode graphs'
    assert not is_mixed_graph_step(step([1] * 10 + [MAX_TOKENS]))  # too many rows
    assert not is_mixed_graph_step(step([3] * (MAX_SLICES + 1)))  # too many slices
    big = step([1] * 900 + [50])  # serving's shape past 512 rows
    assert not is_mixed_graph_step(big) and is_mixed_graph_step(big, 1024)
    assert not is_mixed_graph_step(step([1] * 1000 + [50]), 1024)
    huge = step([1] * 500 + [700, 800])  # the offline budget's: 2,000 rows, two slices
    assert not is_mixed_graph_step(huge, 1024) and is_mixed_graph_step(huge, 2048)
    assert MixedGraphs.key(graphs(), huge)[0] == 2048
    assert MixedGraphs.key(graphs(), step([1] * 500 + [700]))[0] == 1280


def test_a_chat_cohort_step_replays() -> None:
    """A chat server's turns arrive in cohorts: a step of a dozen or more ~100-row slices
    beside the decodes qualifies (up to MAX_SLICES slices). The key takes neither the
    slices' count nor their lengths (each slice is its tiles) nor a few more or fewer
    decodes (final rows floor at FINALS_FLOOR): a cohort, a lone joiner and everything
    between share their rows bucket's graph."""
    def step(decodes: int, lengths: list[int]) -> PackedBatch:
        return build_packed_batch(
            [SegmentSpec(f"d{i}", [1], 900, list(range(60)), [0]) for i in range(decodes)]
            + [SegmentSpec(f"p{i}", [1] * n, 880, list(range(60)), [n - 1])
               for i, n in enumerate(lengths)])

    cohort = step(48, [60] * 15 + [75])  # 1,023 rows, 16 slices
    assert is_mixed_graph_step(cohort, 1024) and not is_mixed_graph_step(cohort)
    key = MixedGraphs.key(graphs(), cohort)
    assert key[:4] == (1024, 128, 1024 // TILE + MAX_SLICES, TILE)
    for other in (step(63, [900]), step(40, [300, 300, 200, 100]), step(20, [90] * 10)):
        assert MixedGraphs.key(graphs(), other)[:4] == key[:4]  # 920-1,000 rows: one shape
    small = {MixedGraphs.key(graphs(), step(d, ls))
             for d, ls in ((63, [84]), (46, [60, 60]), (63, [30, 40, 50]), (50, [70, 70]))}
    assert small == {(192, 128, 192 // TILE + MAX_SLICES, TILE, 1024, 1024)}
    assert MixedGraphs.key(graphs(), step(200, [60]))[1] == 256  # past the floor: its bucket
    assert MixedGraphs.key(graphs(), step(8, [20]))[:2] == (32, 32)  # at most the rows
    assert not is_mixed_graph_step(step(8, [20] * (MAX_SLICES + 1)))


class _Cap:
    seconds = 0.05  # the host time a capture took

    def replay(self, stream: object, meta: np.ndarray, ring: object,
               fill: object = None) -> np.ndarray:
        return np.zeros((512, 4), np.float32)


def _policy_graphs(monkeypatch: pytest.MonkeyPatch, capture) -> MixedGraphs:
    """MixedGraphs over a fake cupy whose captures are ``capture`` (the policy is host code)."""
    import sys
    import types

    from crucible.backend import cupy_mixed_graphs as cmg

    fake = types.ModuleType("cupy")
    fake.asarray = np.asarray
    fake.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cmg, "capture_forward", capture)
    g = graphs()
    g.graphs, g.seen, g.num_captures, g.num_replays, g.num_eager = {}, {}, 0, 0, 0
    g.ring = g.fed_in = None
    g.stream = types.SimpleNamespace(synchronize=lambda: None)
    g.capture_s, g.num_out_of_memory, g.has_room = 0.0, 0, None
    g.capture_after, g.max_graphs = cmg.CAPTURE_AFTER, cmg.MAX_GRAPHS
    g.memory = types.SimpleNamespace(release=lambda: None)  # what the graphs share
    return g


def _step(n_prefill: int) -> PackedBatch:  # one slice of n rows and two decodes
    return build_packed_batch([SegmentSpec("d0", [1], 40, [1, 2, 3], [0]),
                               SegmentSpec("d1", [1], 50, [4, 5, 6], [0]),
                               SegmentSpec("p", [2] * n_prefill, 0, list(range(7, 47)),
                                           [n_prefill - 1])])


def test_captures_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape seen once runs eagerly; the second sighting captures it, later ones replay;
    once MAX_GRAPHS are held no more are made (nothing evicted), and those steps run
    eagerly, counted."""
    from crucible.backend import cupy_mixed_graphs as cmg

    captured: list[int] = []

    def capture(forward: object, stream: object, meta_dev: object, meta: object,
                memory: object, wait: bool = True) -> _Cap:
        # Mixed graphs replay on the capture stream, behind the warm-up: no host wait.
        assert wait is False
        captured.append(meta.num_rows)
        return _Cap()

    monkeypatch.setattr(cmg, "MAX_GRAPHS", 3)
    g = _policy_graphs(monkeypatch, capture)
    sizes = [20, 20, 20, 100, 100, 200, 200, 300, 300, 300]  # four shapes, twice or more
    got = [g.run(_step(n), None) for n in sizes]
    eager = [out is None for out in got]
    # 20: eager, capture, replay; 100: eager, capture; 200: eager, capture; 300: full.
    assert eager == [True, False, False, True, False, True, False, True, True, True]
    assert len(g.graphs) == 3 == g.num_captures == len(captured)
    assert g.capture_s == pytest.approx(0.15)  # each capture's host time, summed
    assert g.num_replays == 4 and g.num_eager == 6
    assert all(out.shape == (3, 4) for out in got if out is not None)  # the final rows only


def test_out_of_memory_halves_what_is_captured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that finds no device memory drops every graph and runs its step eagerly;
    from then on at most half as many graphs as were held are captured, so a device that
    fits two does not fill up, run out and drop them again forever."""
    held: list[MixedGraphs] = []

    def capture(forward: object, stream: object, meta_dev: object, meta: object,
                memory: object, wait: bool = True) -> _Cap:
        if len(held[0].graphs) >= 2:  # this device holds two graphs
            raise MemoryError("out of memory")
        return _Cap()

    g = _policy_graphs(monkeypatch, capture)
    held.append(g)
    g.capture_after = 1
    got = [g.run(_step(n), None) for n in (20, 100, 200, 20, 100, 200, 20, 300)]
    eager = [out is None for out in got]
    # 20, 100 captured; 200 runs out: all dropped, the step eager, at most 1 graph from now
    # on; 20 captured again and replayed; 100, 200 and 300 eager (full), no second failure.
    # The step that ran out counts as eager too (cupy_graph_cache.py, as prefill counts it).
    assert eager == [False, False, True, False, True, True, False, True]
    assert g.num_out_of_memory == 1 and g.max_graphs == 1 and len(g.graphs) == 1
    assert g.num_captures == 3 and g.num_replays == 4 and g.num_eager == 4
