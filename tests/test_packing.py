"""build_packed_batch has two packers (a per-segment loop for few segments, whole-array
operations for many); both must give identical arrays for every batch."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.engine.batch import (
    SegmentSpec,
    _pack_loop,
    _pack_vectorised,
    build_packed_batch,
)

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
