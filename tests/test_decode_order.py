"""The decode graphs list attn_decode's rows longest history first (backend/cupy_meta.py,
BackendOptions.longest_first), on the host: their metadata must hand every real row
exactly one entry holding its own packed row, position and page table, in descending
history order; the batch-1 stack's bucket and the reference family keep row order (the
stack's O partials are indexed by entry, the reference kernel searches an ascending list),
and with the switch off the order is the step's; mixed graphs keep packed order. No GPU
needed: the host side is numpy.
The bits are the GPU test's (tests/test_gpu_decode_order.py)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from crucible.engine.settings import Settings

from crucible.backend.cupy_graphs import DecodeGraphs
from crucible.backend.cupy_meta import longest_first
from crucible.backend.cupy_mixed_graphs import MixedGraphs, slice_tiles
from crucible.backend.options import BackendOptions
from crucible.kernels.variants import parse_variant
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch

SCRATCH = 9000


def decode_step(rng: np.random.Generator, rows: int, slices: int = 0) -> PackedBatch:
    specs = []
    for i in range(rows + slices):
        n = 1 if i < rows else int(rng.integers(2, 40))
        start = int(rng.integers(0, 2500))
        pages = rng.permutation(8000)[: (start + n + 15) // 16].tolist()
        specs.append(SegmentSpec(f"r{i}", rng.integers(0, 999, n).tolist(), start, pages,
                                 [n - 1]))
    order = rng.permutation(len(specs))  # slices among the decode rows, as packed
    return build_packed_batch([specs[i] for i in order])


def owner(variant: str = "exact-q4-k64", on: bool = True) -> types.SimpleNamespace:
    """What the graphs read of their backend: its options and attention variant."""
    return types.SimpleNamespace(variant=parse_variant(variant),
                                 options=BackendOptions(longest_first=on))


def decode_graphs(variant: str, on: bool = True) -> DecodeGraphs:
    g = DecodeGraphs.__new__(DecodeGraphs)  # host side only: no device, no stream
    g.width, g.scratch, g._templates = 176, SCRATCH, {}
    g.owner = owner(variant, on)
    return g


def entries(out: np.ndarray, bucket: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    seg = out[4 * bucket : 8 * bucket].reshape(bucket, 4)
    return seg, out[8 * bucket : 8 * bucket + bucket * width].reshape(bucket, width)


def check_entries(batch: PackedBatch, seg: np.ndarray, tables: np.ndarray,
                  descending: bool) -> None:
    """Every real row's one entry: its row, length 1, its position, its own page table."""
    b = batch.num_rows
    real = seg[:b]
    assert sorted(real[:, 0].tolist()) == list(range(b))
    assert (real[:, 1] == 1).all()
    for e in real:
        row = e[0]
        assert e[2] == batch.positions[row]
        need = -(-(e[2] + 1) // 16)
        src = batch.page_tables[batch.segments[row, 3]]
        assert (tables[e[3], :need] == src[:need]).all()
    starts = real[:, 2]
    if descending:
        assert (np.diff(starts) <= 0).all()
    else:
        assert (real[:, 0] == np.arange(b)).all()


@pytest.mark.parametrize("seed", range(6))
def test_decode_graphs_list_rows_longest_first(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = decode_step(rng, int(rng.integers(40, 250)))
    bucket = 256
    g = decode_graphs("exact-q4-k64")
    seg, tables = entries(g.host_meta(batch, bucket, 176), bucket, 176)
    check_entries(batch, seg, tables, descending=True)
    assert not (np.diff(batch.positions) <= 0).all()  # the step's own order was not sorted
    # padding entries keep their rows past the step's, on the scratch page
    assert (seg[batch.num_rows:, 0] == np.arange(batch.num_rows, bucket)).all()
    assert (tables[batch.num_rows:, 0] == SCRATCH).all()


def test_row_order_where_the_list_must_ascend_or_the_switch_is_off() -> None:
    rng = np.random.default_rng(7)
    batch = decode_step(rng, 100)
    seg, tables = entries(decode_graphs("reference").host_meta(batch, 128, 176), 128, 176)
    check_entries(batch, seg, tables, descending=False)
    one = decode_step(rng, 1)
    seg, tables = entries(decode_graphs("exact-q4-k64").host_meta(one, 1, 176), 1, 176)
    check_entries(one, seg, tables, descending=False)  # the stack's bucket
    seg, tables = entries(decode_graphs("exact-q4-k64", on=False).host_meta(batch, 128, 176),
                          128, 176)
    check_entries(batch, seg, tables, descending=False)


def test_mixed_graphs_keep_their_lists_in_packed_order() -> None:
    """Mixed steps are not reordered (cupy_meta.py says why): the one-row entries and the
    slices' tiles follow the step's packing, each with its own start, history and pages."""
    rng = np.random.default_rng(11)
    batch = decode_step(rng, 120, slices=6)
    g = MixedGraphs.__new__(MixedGraphs)
    g.width, g.scratch, g.classes = 512, SCRATCH, None
    key = g.key(batch)
    t, _, s, _, _, _ = key
    w, _, sizes = g._sizes(key)
    out = g.host_meta(batch, key)
    offs = np.cumsum([0] + sizes)
    tables = out[offs[8]:].reshape(-1, w)
    one = batch.segments[:, 1] == 1
    single, multi = batch.segments[one], batch.segments[~one]
    # the slices as their tiles (cupy_mixed_graphs.slice_tiles), slice by slice as packed
    tiles = slice_tiles(multi, single.shape[0])
    of_tile = multi[tiles[:, 3] - single.shape[0]]  # each tile's slice
    for lo, hi, rows, mine, src in ((offs[4], offs[5], t, single, single[:, 3]),
                                    (offs[5], offs[6], s, tiles, of_tile[:, 3])):
        listed = out[lo:hi].reshape(rows, 4)[: mine.shape[0]]
        assert (listed[:, :3] == mine[:, :3]).all()
        for e, table in zip(listed, src):
            need = -(-(e[2] + e[1]) // 16)
            assert (tables[e[3], :need] == batch.page_tables[table, :need]).all()
    assert (np.diff(tiles[:, 3]) >= 0).all() and (tiles[:, 0] >= of_tile[:, 0]).all()


def test_longest_first_is_a_stable_descending_order() -> None:
    starts = np.array([5, 9, 5, 0, 9, 7], np.int32)
    seg = np.zeros((6, 4), np.int32)
    seg[:, 1], seg[:, 2] = 1, starts
    assert longest_first(seg).tolist() == [1, 4, 5, 0, 2, 3]
    seg[:, 1] = [1, 1, 9, 1, 1, 1]  # by causal end: 5 + 9 passes 9 + 1
    assert longest_first(seg).tolist() == [2, 1, 4, 5, 0, 3]
    assert longest_first(np.zeros((0, 4), np.int32)).tolist() == []


def test_the_switch_reaches_the_backend_options() -> None:
    assert Settings().backend_options().longest_first
    off = Settings.from_env({"CRUCIBLE_LONGEST_FIRST": "0"})
    assert not off.longest_first and not off.backend_options().longest_first
