"""build_packed_batch has two packers (a per-segment loop for few segments, whole-array
operations for many); both must give identical arrays for every batch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from crucible.step.batch import SegmentSpec, _pack_loop, _pack_vectorised, build_packed_batch
from crucible.step.quick_init import quick_init

FIELDS = ("token_ids", "positions", "segments", "page_tables", "table_lengths", "final_rows")


def _random_specs(rng: np.random.Generator, n: int) -> list[SegmentSpec]:
    specs = []
    for i in range(n):
        length = int(rng.integers(1, 40))
        rows = sorted(set(rng.integers(0, length, int(rng.integers(0, 3))).tolist()))
        specs.append(SegmentSpec(f"r{i}", rng.integers(-3, 900, length).tolist(),
                                 int(rng.integers(0, 400)),
                                 rng.integers(0, 600, int(rng.integers(0, 30))).tolist(),
                                 rows[::-1]))  # unsorted on purpose: packing sorts them
    return specs


@pytest.mark.parametrize("seed", range(40))
def test_both_packers_agree(seed: int) -> None:
    rng = np.random.default_rng(seed)
    specs = _random_specs(rng, int(rng.integers(1, 70)))
    a, b = _pack_loop(specs), _pack_vectorised(specs)
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype == np.int32 and x.shape == y.shape, f
        assert np.array_equal(x, y), f
    assert a.request_ids == b.request_ids


def test_packed_layout_by_hand() -> None:
    """Ten decodes (the vectorised packer) plus what each row means."""
    specs = [SegmentSpec(f"r{i}", [100 + i], 20 + i, [3 * i, 3 * i + 1], [0]) for i in range(10)]
    b = build_packed_batch(specs)
    assert b.token_ids.tolist() == list(range(100, 110))
    assert b.positions.tolist() == list(range(20, 30))
    assert b.segments.tolist() == [[i, 1, 20 + i, i] for i in range(10)]
    assert b.page_tables.tolist() == [[3 * i, 3 * i + 1] for i in range(10)]
    assert b.final_rows.tolist() == list(range(10))
    assert b.slot_mapping().tolist() == [(3 * i + 1) * 16 + (20 + i) % 16 for i in range(10)]


def test_quick_init_keeps_a_frozen_dataclass() -> None:
    """The per-step records built with quick_init behave as the generated frozen __init__
    made them: same fields, keywords, eq, repr, replace(), and no assignment."""
    from crucible.step.rows import RowSampling
    from crucible.engine.engine import RequestDelta
    from crucible.engine.sampling import SampleResult
    from crucible.engine.scheduler import ScheduledSlice

    @dataclasses.dataclass(frozen=True)
    class Plain:
        a: int
        b: tuple[int, ...]

    @quick_init
    @dataclasses.dataclass(frozen=True)
    class Quick:
        a: int
        b: tuple[int, ...]

    x, y = Quick(1, b=(2,)), Plain(1, b=(2,))
    assert (x.a, x.b) == (y.a, y.b) and repr(x) == repr(y).replace("Plain", "Quick")
    assert x == Quick(a=1, b=(2,)) and x != Quick(1, (3,)) and hash(x) == hash(Quick(1, (2,)))
    assert dataclasses.replace(x, a=5) == Quick(5, (2,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.a = 2
    with pytest.raises(TypeError):
        Quick(1)
    for cls in (SegmentSpec, ScheduledSlice, RowSampling, SampleResult, RequestDelta):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    spec = SegmentSpec("r", [1], 0, [2], [0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.pages = [3]


def test_quick_init_refuses_what_it_cannot_keep() -> None:
    @dataclasses.dataclass(frozen=True)
    class WithDefault:
        a: int = 0

    @dataclasses.dataclass
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    for cls in (WithDefault, NotFrozen, Slotted):
        with pytest.raises(TypeError):
            quick_init(cls)
def test_pack_decodes_equals_the_spec_packing() -> None:
    """The pipelined step's direct packing == packing one-row specs of token 0 (every
    column, the request ids), across table widths and page counts."""
    from crucible.step.batch import pack_decodes

    rng = np.random.default_rng(11)
    for n in (1, 7, 8, 300):
        pos = rng.integers(0, 5000, n).tolist()
        pages = [rng.permutation(9000)[: p // 16 + 1].tolist() for p in pos]
        ids = [f"r{i}" for i in range(n)]
        got = pack_decodes(ids, pos, pages)
        want = build_packed_batch([SegmentSpec(r, [0], p, pg, [0])
                                   for r, p, pg in zip(ids, pos, pages)])
        for f in ("token_ids", "positions", "segments", "page_tables", "table_lengths",
                  "final_rows"):
            a, b = getattr(got, f), getattr(want, f)
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), f
        assert got.request_ids == want.request_ids


@pytest.mark.parametrize("seed", range(12))
def test_concatenated_batches_equal_one_packing(seed: int) -> None:
    """A pipelined mixed step packs its decode rows and its slices apart and joins them
    (``concat_batches``): that must be the batch of all the specs packed at once, every
    column and dtype, whichever packer made each half (empty halves included)."""
    from crucible.step.batch import concat_batches

    rng = np.random.default_rng(100 + seed)
    specs = _random_specs(rng, int(rng.integers(1, 40)))
    cut = int(rng.integers(1, len(specs) + 1))
    got = concat_batches(build_packed_batch(specs[:cut]), build_packed_batch(specs[cut:]))
    want = build_packed_batch(specs)
    for f in FIELDS:
        x, y = getattr(got, f), getattr(want, f)
        assert x.dtype == y.dtype == np.int32 and x.shape == y.shape, f
        assert np.array_equal(x, y), f
    assert got.request_ids == want.request_ids
