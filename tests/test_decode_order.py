"""Attention's segment lists longest history first (backend/cupy_meta.py,
BackendOptions.longest_first), on the host: the decode and mixed graphs' metadata must hand
every real row exactly one entry holding its own packed row, position and page table, in
descending history order (a mixed step's slices by causal end); the batch-1 stack's bucket and the reference family keep row order (the
stack's O partials are indexed by entry, the reference kernel searches an ascending list),
and with the switch off the order is the step's. No GPU needed: the host side is numpy.
The bits are the GPU test's (tests/test_gpu_decode_order.py)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from crucible.engine.settings import Settings

from crucible.backend.cupy_graphs import DecodeGraphs
from crucible.backend.cupy_meta import longest_first
from crucible.backend.cupy_mixed_graphs import MixedGraphs
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


@pytest.mark.parametrize("longest", [True, False])
def test_mixed_graphs_list_decode_rows_longest_first(longest: bool) -> None:
    rng = np.random.default_rng(11)
    batch = decode_step(rng, 120, slices=6)
    g = MixedGraphs.__new__(MixedGraphs)
    g.width, g.scratch, g.classes, g.owner = 512, SCRATCH, None, owner(on=longest)
    key = g.key(batch)
    t, _, s, _, _, _ = key
    w, _, sizes = g._sizes(key)
    out = g.host_meta(batch, key)
    offs = np.cumsum([0] + sizes)
    single = out[offs[4] : offs[5]].reshape(t, 4)
    tables = out[offs[8]:].reshape(-1, w)
    one = batch.segments[batch.segments[:, 1] == 1]
    d = one.shape[0]
    real = single[:d]
    assert sorted(real[:, 0].tolist()) == sorted(one[:, 0].tolist())
    for e in real:
        k = int(np.nonzero(batch.segments[:, 0] == e[0])[0][0])
        assert e[1] == 1 and e[2] == batch.segments[k, 2]
        need = -(-(e[2] + 1) // 16)
        assert (tables[e[3], :need] == batch.page_tables[batch.segments[k, 3], :need]).all()
    slices = batch.segments[batch.segments[:, 1] > 1]
    listed = out[offs[5] : offs[6]].reshape(s, 4)[: slices.shape[0]]
    assert sorted(listed[:, 0].tolist()) == sorted(slices[:, 0].tolist())
    for e in listed:  # each slice's own start, length, history and pages
        k = int(np.nonzero(batch.segments[:, 0] == e[0])[0][0])
        assert (e[1], e[2]) == (batch.segments[k, 1], batch.segments[k, 2])
        need = -(-(e[2] + e[1]) // 16)
        assert (tables[e[3], :need] == batch.page_tables[batch.segments[k, 3], :need]).all()
    ends = slices[:, 2] + slices[:, 1]
    assert not (np.diff(ends) <= 0).all() and not (np.diff(one[:, 2]) <= 0).all()  # unsorted
    if longest:
        assert (np.diff(real[:, 2]) <= 0).all()
        assert (np.diff(listed[:, 2] + listed[:, 1]) <= 0).all()
    else:
        assert (real[:, 0] == one[:, 0]).all() and (listed[:, 0] == slices[:, 0]).all()


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
