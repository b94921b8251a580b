"""Host validation of a PackedBatch before any backend call.

A kernel trusts its metadata: a bad start, length or page id would read or write another
request's K/V (or out of the pool) silently. So every batch is checked here, in int64 so
that no check itself overflows, and the first problem raises BatchValidationError naming
the segment/row and the offending values. Checked: array types, dtypes and shapes; segments
tiling the packed rows in order; positions matching the descriptors; table indices and
lengths; each slice's absolute end within its page table; page ids within the pool; no
page twice in one table; no page written by a segment present in any other table; final
rows in range and strictly ascending; token ids within the vocabulary.
"""

from __future__ import annotations

import numpy as np

from crucible.step.batch import PAGE_SHIFT, PAGE_SIZE, PackedBatch
from crucible.engine.validate_fast import segments_ok, small_ok, vector_ok, writes_shared
from crucible.errors import BatchValidationError

_INT32_MAX = 2**31 - 1
_VECTOR_FROM = 16  # segments; below this the Python walk is the faster check


def _fail(msg: str) -> None:
    raise BatchValidationError(f"invalid packed batch: {msg}")


def _check_array(name: str, a: object, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        _fail(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.int32:
        _fail(f"{name} must be int32, got {a.dtype}")
    if a.ndim != ndim:
        _fail(f"{name} must be {ndim}-D, got shape {a.shape}")
    return a.astype(np.int64)


def validate_packed_batch(batch: PackedBatch, *, num_pages: int, vocab_size: int,
                          max_pages_per_table: int | None = None) -> None:
    """Raise BatchValidationError unless ``batch`` is safe to hand to a backend."""
    # A good batch is accepted by one of two silent passes (plain Python when small, whole
    # arrays otherwise); anything else (a problem, or a page shared read-only) goes through
    # the checks below, which name the first problem.
    if (small_ok(batch, num_pages, vocab_size, max_pages_per_table)
            or vector_ok(batch, num_pages, vocab_size, max_pages_per_table)):
        return
    tokens = _check_array("token_ids", batch.token_ids, 1)
    positions = _check_array("positions", batch.positions, 1)
    segs = _check_array("segments", batch.segments, 2)
    tables = _check_array("page_tables", batch.page_tables, 2)
    lengths = _check_array("table_lengths", batch.table_lengths, 1)
    finals = _check_array("final_rows", batch.final_rows, 1)
    n_rows = tokens.shape[0]
    if positions.shape[0] != n_rows:
        _fail(f"positions has {positions.shape[0]} rows, token_ids has {n_rows}")
    if n_rows == 0:
        _fail("batch has no rows")
    if segs.shape[1] != 4:
        _fail(f"segments must be [S, 4], got shape {segs.shape}")
    n_segs = segs.shape[0]
    if len(batch.request_ids) != n_segs:
        _fail(f"{len(batch.request_ids)} request ids for {n_segs} segments")
    if lengths.shape[0] != tables.shape[0]:
        _fail(f"{lengths.shape[0]} table lengths for {tables.shape[0]} page tables")

    # Segments: non-negative, non-empty, tiling rows 0..T in order with no gap or overlap.
    # This runs every step, with one segment per running request. Few segments: walk them
    # (cheapest in Python). Many: a vectorised pass accepts a good batch, and only a bad one
    # is walked, to name its first problem.
    many = segs.shape[0] > _VECTOR_FROM
    if not (many and segments_ok(segs, tables, lengths, n_rows, max_pages_per_table)):
        _check_segments(batch, segs, tables, lengths, n_rows, max_pages_per_table)

    # Positions: row packed_start + r sits at absolute_start + r.
    seg_of_row = np.repeat(np.arange(n_segs), segs[:, 1])
    want = segs[seg_of_row, 2] + (np.arange(n_rows) - segs[seg_of_row, 0])
    bad = np.flatnonzero(positions != want)
    if bad.size:
        r = int(bad[0])
        _fail(f"row {r} has position {positions[r]}, its segment descriptor says {want[r]}")

    # Page ids and ownership over the valid part of every table (vectorised: this runs
    # every step over every page of every running request).
    valid = np.arange(tables.shape[1])[None, :] < lengths[:, None]
    table_of, entry_of = np.nonzero(valid)
    pages = tables[valid]
    out = np.flatnonzero((pages < 0) | (pages >= num_pages))
    if out.size:
        k = int(out[0])
        _fail(f"table {table_of[k]} entry {entry_of[k]} is page {pages[k]}, outside the pool "
              f"[0, {num_pages})")
    order = np.lexsort((pages, table_of))
    same = (table_of[order][1:] == table_of[order][:-1]) & (pages[order][1:] == pages[order][:-1])
    if same.any():
        k = order[int(np.flatnonzero(same)[0])]
        _fail(f"page {pages[k]} appears twice in table {table_of[k]}")
    # Pages held by two or more tables (prefix-cache sharing; a table's own duplicates were
    # rejected above). Usually none, and then no segment can write a shared page.
    uniq, counts = np.unique(pages, return_counts=True)
    shared_pages = uniq[counts > 1]
    # Pages a segment writes: entries first..last of its own table (each table has at most
    # one segment, checked above).
    if shared_pages.size and (not many or writes_shared(segs, tables, shared_pages)):
        for i, (_, length, abs_start, t) in enumerate(segs.tolist()):
            w = tables[t, abs_start >> PAGE_SHIFT : ((abs_start + length - 1) >> PAGE_SHIFT) + 1]
            shared = w[np.isin(w, shared_pages)]
            if shared.size:
                _fail(f"segment {i} ({batch.request_ids[i]}) writes page {shared[0]}, which "
                      f"another page table also holds (a request never writes a page others "
                      f"can read)")

    # Final rows: in range, strictly ascending (so no duplicates).
    if finals.size:
        if finals.min() < 0 or finals.max() >= n_rows:
            _fail(f"final_rows {finals.tolist()} out of range [0, {n_rows})")
        if np.any(np.diff(finals) <= 0):
            _fail(f"final_rows {finals.tolist()} are not strictly ascending")
    bad = np.flatnonzero((tokens < 0) | (tokens >= vocab_size))
    if bad.size:
        r = int(bad[0])
        _fail(f"row {r} token id {tokens[r]} outside the vocabulary [0, {vocab_size})")


def _check_segments(batch: PackedBatch, segs: np.ndarray, tables: np.ndarray,
                    lengths: np.ndarray, n_rows: int, max_pages_per_table: int | None) -> None:
    """Walk the segments in order and fail on the first problem, naming it."""
    n_segs = segs.shape[0]
    expected_start = 0
    for i, (start, length, abs_start, t) in enumerate(segs.tolist()):
        rid = batch.request_ids[i]
        if start < 0 or length < 0 or abs_start < 0:
            _fail(f"segment {i} ({rid}) has a negative field: start={start}, "
                  f"chunk_len={length}, absolute_start={abs_start}")
        if length == 0:
            _fail(f"segment {i} ({rid}) is empty (chunk_len=0)")
        if start + length > _INT32_MAX or abs_start + length > _INT32_MAX:
            _fail(f"segment {i} ({rid}) overflows int32: start={start}, chunk_len={length}, "
                  f"absolute_start={abs_start}")
        if start != expected_start:
            _fail(f"segment {i} ({rid}) starts at row {start}, expected {expected_start} "
                  f"(segments must tile the rows in order)")
        expected_start = start + length
        if not 0 <= t < tables.shape[0]:
            _fail(f"segment {i} ({rid}) table_index {t} out of range [0, {tables.shape[0]})")
        n_table = lengths[t]
        if not 0 <= n_table <= tables.shape[1]:
            _fail(f"table {t} length {n_table} outside [0, {tables.shape[1]}]")
        if max_pages_per_table is not None and n_table > max_pages_per_table:
            _fail(f"table {t} has {n_table} pages, more than the limit {max_pages_per_table}")
        if abs_start + length > n_table * PAGE_SIZE:
            _fail(f"segment {i} ({rid}) ends at position {abs_start + length}, past its page "
                  f"table of {n_table} pages ({n_table * PAGE_SIZE} positions)")
    if expected_start != n_rows:
        _fail(f"segments cover {expected_start} rows, the batch has {n_rows}")
    if len(set(segs[:, 3].tolist())) != n_segs:
        _fail("two segments share one page table")
