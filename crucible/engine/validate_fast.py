"""The silent passes of batch validation (engine/validate.py): they only accept.

Validation runs every step, so a good batch is accepted without the ~20 numpy calls of the
naming checks: a small one (a decode step of a few requests) by one plain-Python pass, a
larger one by whole-array checks. Either returns False for anything unusual, and the batch
then goes through validate.py's checks, which name its first problem. What they accept is
exactly what those checks accept (tests/test_validate.py).
"""

from __future__ import annotations

import numpy as np

from crucible.step.batch import PAGE_SHIFT, PAGE_SIZE, PackedBatch

_INT32_MAX = 2**31 - 1
# At or below these sizes (a decode step of a few requests) one plain-Python pass accepts a
# good batch more cheaply than the ~20 numpy calls the checks cost whatever the size.
_SMALL_ROWS, _SMALL_SEGS = 64, 8
# Counting (np.bincount) instead of sorting while the values' range is at most this many
# times their number (_pages_ok). On the CI machine 7,000 pages of a pool of 57,000 count in
# 38 us and sort in 104; the two meet near 28x (a sort with wider vector units, elsewhere,
# meets the count sooner).
_COUNT_SPAN = 16


def writes_shared(segs: np.ndarray, tables: np.ndarray, shared_pages: np.ndarray) -> bool:
    """Whether any segment writes one of ``shared_pages`` (sorted, distinct; vectorised)."""
    lo, hi = np.zeros(tables.shape[0], np.int64), np.full(tables.shape[0], -1, np.int64)
    lo[segs[:, 3]] = segs[:, 2] >> PAGE_SHIFT
    hi[segs[:, 3]] = (segs[:, 2] + segs[:, 1] - 1) >> PAGE_SHIFT
    col = np.arange(tables.shape[1])[None, :]
    w = tables[(col >= lo[:, None]) & (col <= hi[:, None])]
    at = np.minimum(np.searchsorted(shared_pages, w), shared_pages.size - 1)
    return bool((shared_pages[at] == w).any())  # (a binary search: the writes are few)


def segments_ok(segs: np.ndarray, tables: np.ndarray, lengths: np.ndarray, n_rows: int,
                 max_pages: int | None) -> bool:
    """True when every segment check below passes (vectorised; no message). Minima and
    maxima replace elementwise masks where they can: this runs every step."""
    if segs.shape[0] == 0:
        return n_rows == 0
    start, length, abs_start, t = segs.T
    min_start, min_length, min_abs, min_t = segs.min(axis=0).tolist()
    if min_start < 0 or min_length <= 0 or min_abs < 0 or min_t < 0:
        return False
    ends = np.cumsum(length)
    if ends[-1] != n_rows or (start != ends - length).any():
        return False
    # Tiled with positive lengths, start + length is ends, whose largest is ends[-1].
    abs_end = abs_start + length
    if ends[-1] > _INT32_MAX or abs_end.max() > _INT32_MAX:
        return False
    if t.max() >= tables.shape[0]:
        return False
    n_table = lengths[t]
    if n_table.min() < 0 or n_table.max() > tables.shape[1]:
        return False
    if max_pages is not None and n_table.max() > max_pages:
        return False
    if (abs_end > n_table * PAGE_SIZE).any():
        return False
    return _distinct(t)


def _well_typed(batch: PackedBatch) -> bool:
    """Every array an int32 numpy array of the right rank (what _check_array demands)."""
    arrays = (batch.token_ids, batch.positions, batch.segments, batch.page_tables,
              batch.table_lengths, batch.final_rows)
    return all(isinstance(a, np.ndarray) and a.dtype == np.int32 and a.ndim == ndim
               for a, ndim in zip(arrays, (1, 1, 2, 2, 1, 1)))


def _pages_ok(segs: np.ndarray, tables: np.ndarray, valid: np.ndarray, pages: np.ndarray,
              bound: int) -> bool:
    """No table holds a page twice and no segment writes a page held more than once.
    ``pages``: every table's entries (``valid``'s), all in [0, ``bound``). Pages several
    tables hold are fine (the prefix cache's, every step of a chat server).

    Counting beats sorting while the pages' range is within some times their number (a
    decode step of 64 chat requests: ~7,000 entries, a 127 us sort against a 14 us count on
    the CI machine); a pool far larger than the batch's pages goes back to the sort."""
    if bound <= _COUNT_SPAN * pages.size:
        counts = np.bincount(pages, minlength=bound)
        shared = np.flatnonzero(counts > 1)  # sorted, distinct
        if not shared.size:
            return True
        held = counts[pages] > 1
    else:
        s = np.sort(pages)
        twice = s[1:][s[1:] == s[:-1]]
        if not twice.size:
            return True
        shared = twice[np.concatenate(([True], twice[1:] != twice[:-1]))]
        at = np.minimum(np.searchsorted(shared, pages), shared.size - 1)
        held = shared[at] == pages
    # Only the entries of pages held more than once can repeat within a table: each as
    # (its table, its page's rank among those pages), which must all differ.
    table_of = np.nonzero(valid)[0][held]
    pair = table_of * shared.size + np.searchsorted(shared, pages[held])
    span = tables.shape[0] * shared.size
    if span <= _COUNT_SPAN * pair.size:
        if np.bincount(pair, minlength=span).max() > 1:
            return False
    elif not _distinct(pair):
        return False
    return not writes_shared(segs, tables, shared)


def _distinct(a: np.ndarray) -> bool:
    """No value twice in the 1-D ``a`` (one sort; cheaper than np.unique)."""
    s = np.sort(a)
    return not (s[1:] == s[:-1]).any()


def vector_ok(batch: PackedBatch, num_pages: int, vocab_size: int,
               max_pages: int | None) -> bool:
    """True when the batch passes every check of validate_packed_batch, in whole-array
    operations (a decode step of many requests). It only accepts: False (a problem) leaves
    the verdict and the message to the full checks."""
    if not _well_typed(batch):
        return False
    tokens, positions, tables, finals = (batch.token_ids, batch.positions, batch.page_tables,
                                         batch.final_rows)
    segs, lengths = batch.segments.astype(np.int64), batch.table_lengths.astype(np.int64)
    n_rows = tokens.shape[0]
    if n_rows == 0 or positions.shape[0] != n_rows or segs.shape[1] != 4:
        return False
    if len(batch.request_ids) != segs.shape[0] or lengths.shape[0] != tables.shape[0]:
        return False
    if not segments_ok(segs, tables, lengths, n_rows, max_pages):
        return False
    # Row packed_start + r sits at absolute_start + r (segments tile the rows, checked).
    if (positions != np.repeat(segs[:, 2] - segs[:, 0], segs[:, 1]) + np.arange(n_rows)).any():
        return False
    # Every page in the pool; a page several tables hold (read-only sharing) only where no
    # table holds it twice and no segment writes it (_pages_ok).
    valid = np.arange(tables.shape[1])[None, :] < lengths[:, None]
    pages = tables[valid]
    if pages.size:
        top = int(pages.max())
        if pages.min() < 0 or top >= num_pages:
            return False
        if not _pages_ok(segs, tables, valid, pages, top + 1):
            return False
    if finals.size and not (finals[0] >= 0 and finals[-1] < n_rows
                            and (finals[1:] > finals[:-1]).all()):
        return False
    return bool(tokens.min() >= 0 and tokens.max() < vocab_size)


def small_ok(batch: PackedBatch, num_pages: int, vocab_size: int,
              max_pages: int | None) -> bool:
    """True when a small batch passes every check below, in plain Python. It only accepts:
    False (anything unusual, or a batch too big for this pass) sends the batch through the
    full checks, which name the first problem."""
    if not _well_typed(batch):
        return False
    # Sizes first: a big batch is sent on before any array is turned into lists.
    if not 0 < batch.token_ids.shape[0] <= _SMALL_ROWS or batch.segments.shape[0] > _SMALL_SEGS:
        return False
    tokens, positions = batch.token_ids.tolist(), batch.positions.tolist()
    n_rows, segs = len(tokens), batch.segments.tolist()
    if len(positions) != n_rows:
        return False
    if batch.segments.shape[1] != 4 or len(batch.request_ids) != len(segs):
        return False
    tables, lengths = batch.page_tables.tolist(), batch.table_lengths.tolist()
    width = batch.page_tables.shape[1]
    if len(lengths) != len(tables) or any(not 0 <= n <= width for n in lengths):
        return False
    expected, used, written = 0, set(), []
    for start, length, abs_start, t in segs:
        if start != expected or length <= 0 or not 0 <= abs_start <= _INT32_MAX - length:
            return False
        if not 0 <= t < len(tables) or t in used:
            return False
        used.add(t)
        n_table = lengths[t]
        if (max_pages is not None and n_table > max_pages) or \
                abs_start + length > n_table * PAGE_SIZE:
            return False
        if positions[start : start + length] != list(range(abs_start, abs_start + length)):
            return False
        written.append((t, abs_start >> PAGE_SHIFT, (abs_start + length - 1) >> PAGE_SHIFT))
        expected = start + length
    if expected != n_rows:
        return False
    holders: dict[int, int] = {}  # page -> tables holding it
    for row, n in zip(tables, lengths):
        pages = row[:n]
        if len(set(pages)) != n or any(not 0 <= p < num_pages for p in pages):
            return False
        for p in pages:
            holders[p] = holders.get(p, 0) + 1
    if any(holders[p] > 1 for t, lo, hi in written for p in tables[t][lo : hi + 1]):
        return False
    prev = -1
    for f in batch.final_rows.tolist():
        if not prev < f < n_rows:
            return False
        prev = f
    return all(0 <= x < vocab_size for x in tokens)
