"""Twenty malformed packed batches that host validation must reject before any device work.

Each case mutates one field of a valid three-segment batch; the command checks that
``validate_packed_batch`` raises ``BatchValidationError`` for every one and that no K/V page
of the pool changed (nothing reached the backend).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch


def valid_batch() -> PackedBatch:
    return build_packed_batch([
        SegmentSpec("a", list(range(1, 21)), 0, [3, 5], [19]),
        SegmentSpec("b", [7], 40, [0, 1, 2], [0]),
        SegmentSpec("c", [1, 2, 3, 4], 8, [7], [3]),
    ])


def _arr(name: str, fn: Callable[[np.ndarray], None]) -> Callable[[PackedBatch], PackedBatch]:
    def mutate(b: PackedBatch) -> PackedBatch:
        a = getattr(b, name).copy()
        fn(a)
        return replace(b, **{name: a})

    return mutate


def _set(name: str, index: tuple, value: int) -> Callable[[PackedBatch], PackedBatch]:
    return _arr(name, lambda a: a.__setitem__(index, value))


CASES: dict[str, Callable[[PackedBatch], PackedBatch]] = {
    "negative packed_start": _set("segments", (0, 0), -1),
    "gap between segments": _set("segments", (1, 0), 21),
    "chunk_len zero": _set("segments", (2, 1), 0),
    "chunk_len past the rows": _set("segments", (2, 1), 50),
    "negative absolute_start": _set("segments", (1, 2), -3),
    "absolute end past the page table": _set("segments", (1, 2), 48),
    "int32 overflow of start + len": _set("segments", (2, 2), 2**31 - 2),
    "table_index out of range": _set("segments", (1, 3), 9),
    "two segments share a table": _set("segments", (2, 3), 0),
    "position disagrees with descriptor": _set("positions", (3,), 99),
    "page id past the pool": _set("page_tables", (0, 1), 10_000),
    "negative page id": _set("page_tables", (1, 0), -1),
    "page written by two requests": _set("page_tables", (2, 0), 5),
    "page twice in one table": _set("page_tables", (1, 2), 0),
    "table length past its row": _set("table_lengths", (2,), 9),
    "final row out of range": _set("final_rows", (2,), 25),
    "final rows duplicated": _set("final_rows", (1,), 19),
    "final rows unsorted": _arr("final_rows", lambda a: a.__setitem__(slice(None), a[::-1])),
    "token id past the vocabulary": _set("token_ids", (0,), 1_000_000),
    "wrong dtype of segments": lambda b: replace(b, segments=b.segments.astype(np.int64)),
}
