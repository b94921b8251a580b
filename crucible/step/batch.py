"""The per-step packed batch: one frozen description of everything a forward needs.

A step packs the rows of several requests into one forward. Request i contributes one
contiguous run of rows (a *segment*), described by the descriptor
``int32[packed_start, chunk_len, absolute_start, table_index]``:

- rows ``packed_start .. packed_start + chunk_len`` of the packed arrays belong to it;
- row ``packed_start + r`` sits at absolute position ``absolute_start + r`` of the request;
- its history (positions ``0 .. absolute_start + chunk_len``) lives in the pages listed in
  ``page_tables[table_index, :table_lengths[table_index]]``; position ``p`` is slot
  ``p & 15`` of page ``page_tables[table_index, p >> 4]``.

Segments tile the packed rows in order with no gap. ``final_rows`` are the packed rows
whose logits are wanted (the last row of each segment that samples, plus any rows asked
for prompt logprobs). The arrays are built once per step by ``build_packed_batch`` and
validated by ``validate_packed_batch`` before any backend sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np

from crucible.step.quick_init import quick_init

PAGE_SIZE = 16
PAGE_SHIFT = 4


@quick_init
@dataclass(frozen=True)
class SegmentSpec:
    """One request's slice in a step, before packing (the scheduler's output)."""

    request_id: str
    token_ids: Sequence[int]  # the slice's tokens, len == chunk_len
    absolute_start: int  # position of the first token of the slice
    pages: Sequence[int]  # the request's page table (logical page -> physical page)
    logits_rows: Sequence[int]  # offsets within the slice whose logits are wanted


@dataclass(frozen=True)
class PackedBatch:
    token_ids: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]
    segments: np.ndarray  # int32 [S, 4]: packed_start, chunk_len, absolute_start, table_index
    page_tables: np.ndarray  # int32 [S, P]; entries past table_lengths are 0 and never read
    table_lengths: np.ndarray  # int32 [S]
    final_rows: np.ndarray  # int32 [R], ascending packed row indices
    request_ids: tuple[str, ...]  # per segment

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_segments(self) -> int:
        return int(self.segments.shape[0])

    @property
    def max_chunk(self) -> int:
        return int(self.segments[:, 1].max()) if self.num_segments else 0

    @property
    def max_end(self) -> int:
        """Longest absolute slice end: it sizes the attention score capacity."""
        if not self.num_segments:
            return 0
        return int((self.segments[:, 1] + self.segments[:, 2]).max())

    def slot_mapping(self) -> np.ndarray:
        """Flat pool slot (physical_page * 16 + slot) of every packed row, int64 [T]."""
        seg_of_row = np.repeat(np.arange(self.num_segments), self.segments[:, 1])
        tables = self.page_tables[self.segments[seg_of_row, 3]]
        pos = self.positions.astype(np.int64)
        page = tables[np.arange(self.num_rows), pos >> PAGE_SHIFT].astype(np.int64)
        return page * PAGE_SIZE + (pos & (PAGE_SIZE - 1))


VECTOR_FROM = 8  # segments; below this the per-segment loop is cheaper than numpy set-up


def build_packed_batch(specs: Sequence[SegmentSpec]) -> PackedBatch:
    """Pack scheduler slices into one batch. A few segments (a prefill) are copied one by
    one; many (one per running decode) are packed with whole-array operations."""
    if len(specs) >= VECTOR_FROM:
        return _pack_vectorised(specs)
    return _pack_loop(specs)


def _pack_loop(specs: Sequence[SegmentSpec]) -> PackedBatch:
    n_rows = sum(len(s.token_ids) for s in specs)
    width = max((len(s.pages) for s in specs), default=0)
    token_ids = np.empty(n_rows, dtype=np.int32)
    positions = np.empty(n_rows, dtype=np.int32)
    segments = np.empty((len(specs), 4), dtype=np.int32)
    tables = np.zeros((len(specs), max(width, 1)), dtype=np.int32)
    lengths = np.empty(len(specs), dtype=np.int32)
    finals: list[int] = []
    start = 0
    for i, s in enumerate(specs):
        n = len(s.token_ids)
        token_ids[start : start + n] = s.token_ids
        positions[start : start + n] = np.arange(s.absolute_start, s.absolute_start + n)
        segments[i] = (start, n, s.absolute_start, i)
        tables[i, : len(s.pages)] = s.pages
        lengths[i] = len(s.pages)
        finals.extend(start + r for r in sorted(s.logits_rows))
        start += n
    return _batch(specs, token_ids, positions, segments, tables, lengths, finals)


def _pack_vectorised(specs: Sequence[SegmentSpec]) -> PackedBatch:
    n = len(specs)
    lens = np.fromiter((len(s.token_ids) for s in specs), np.int64, n)
    abs_starts = np.fromiter((s.absolute_start for s in specs), np.int64, n)
    n_pages = np.fromiter((len(s.pages) for s in specs), np.int64, n)
    packed_starts = np.cumsum(lens) - lens
    n_rows = int(lens.sum())
    token_ids = np.fromiter(chain.from_iterable(s.token_ids for s in specs), np.int32, n_rows)
    # Row r of segment i sits at abs_start_i + (r - packed_start_i).
    positions = (np.repeat(abs_starts - packed_starts, lens) + np.arange(n_rows)).astype(np.int32)
    segments = np.stack([packed_starts, lens, abs_starts, np.arange(n)], axis=1).astype(np.int32)
    tables = page_tables([s.pages for s in specs], n_pages)
    finals: list[int] = []
    for start, s in zip(packed_starts.tolist(), specs):
        rows = s.logits_rows
        if len(rows) == 1:  # a decode: nothing to sort (a third of this loop's cost)
            finals.append(start + rows[0])
        else:
            finals.extend(start + r for r in sorted(rows))
    return _batch(specs, token_ids, positions, segments, tables, n_pages.astype(np.int32),
                  finals)


def pack_decodes(request_ids: Sequence[str], positions: Sequence[int],
                 pages: Sequence[Sequence[int]]) -> PackedBatch:
    """A decode step (one row per request, every row final) from per-request lists, no
    SegmentSpec per row (``decode_batch`` of its tables; the pipelined step,
    engine/pipeline.py, calls that with the columns it keeps)."""
    n_pages = np.fromiter(map(len, pages), np.int64, len(request_ids))
    return decode_batch(tuple(request_ids), np.asarray(positions, dtype=np.int32),
                        page_tables(pages, n_pages), n_pages.astype(np.int32))


def decode_batch(request_ids: tuple[str, ...], positions: np.ndarray, tables: np.ndarray,
                 lengths: np.ndarray) -> PackedBatch:
    """A decode step from whole columns: row i is segment i, at ``positions[i]``, reading
    table i (``lengths[i]`` pages); its token comes from the device (0 stands in)."""
    n = len(request_ids)
    pos = positions.astype(np.int32, copy=False)
    rows = np.arange(n, dtype=np.int32)
    segments = np.stack([rows, np.ones(n, np.int32), pos, rows], axis=1)
    return PackedBatch(token_ids=np.zeros(n, np.int32), positions=pos, segments=segments,
                       page_tables=tables, table_lengths=lengths, final_rows=rows,
                       request_ids=request_ids)


def concat_batches(a: PackedBatch, b: PackedBatch) -> PackedBatch:
    """``a``'s segments, then ``b``'s, as one batch (a pipelined mixed step: its decode rows
    as columns, then the slices packed from specs)."""
    t, s = a.num_rows, a.num_segments
    segs = b.segments.copy()
    segs[:, 0] += t
    segs[:, 3] += s
    w = max(a.page_tables.shape[1], b.page_tables.shape[1])
    tables = np.zeros((s + b.num_segments, w), np.int32)
    tables[:s, : a.page_tables.shape[1]] = a.page_tables
    tables[s:, : b.page_tables.shape[1]] = b.page_tables
    return PackedBatch(token_ids=np.concatenate([a.token_ids, b.token_ids]),
                       positions=np.concatenate([a.positions, b.positions]),
                       segments=np.concatenate([a.segments, segs]), page_tables=tables,
                       table_lengths=np.concatenate([a.table_lengths, b.table_lengths]),
                       final_rows=np.concatenate([a.final_rows, b.final_rows + t]).astype(
                           np.int32, copy=False),
                       request_ids=a.request_ids + b.request_ids)


def page_tables(pages: Sequence[Sequence[int]], n_pages: np.ndarray) -> np.ndarray:
    """Every segment's page list as one zero-padded int32 [S, P] table, in one copy."""
    width = max(int(n_pages.max()), 1) if len(pages) else 1
    tables = np.zeros((len(pages), width), dtype=np.int32)
    # Row-major order of the mask is the order the pages are chained in.
    tables[np.arange(width)[None, :] < n_pages[:, None]] = np.fromiter(
        chain.from_iterable(pages), np.int32, int(n_pages.sum()))
    return tables


def _batch(specs: Sequence[SegmentSpec], token_ids: np.ndarray, positions: np.ndarray,
           segments: np.ndarray, tables: np.ndarray, lengths: np.ndarray,
           finals: list[int]) -> PackedBatch:
    return PackedBatch(token_ids=token_ids, positions=positions, segments=segments,
                       page_tables=tables, table_lengths=lengths,
                       final_rows=np.asarray(finals, dtype=np.int32),
                       request_ids=tuple(s.request_id for s in specs))
