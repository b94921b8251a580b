"""Pipelined steps' decode rows as columns, and how step t's become step t+1's.

A decode row's metadata does not depend on the token it feeds: positions, pages and slots
follow from the lengths, and a plain sampling row (no penalties, ``min_tokens`` met) needs
only its draw counter. So the engine can plan step t+1's decode rows from step t's plan
alone (engine/pipeline_next.py) and queue the step; its rows read their input ids from the
device, where step t's sampler wrote them (``ModelRunner.launch_sample(..., feed=...)``).
The host then reads step t's ids while the device computes step t+1, so the host's share of
a step (scheduling, packing, validation, detokenizing) overlaps the device's instead of
adding to it. The tokens are the same bits as without pipelining: every row computes what
it would have computed one step later.

What a request cannot know yet is whether step t stopped it (a stop id, a stop string).
Such a request's row of step t+1 is computed and dropped. That row only writes the K/V of
the request's own last token at the next position, in a page the request owns; a page it
releases afterwards is reused only by steps queued after that row, in stream order.
Requests that step t certainly ends (``max_tokens``, the context) are left out of step t+1,
and so are requests that ended since step t was planned.

The rows are kept as columns (``DecodeRows``: one row per request, numpy arrays of
positions, draw counters, limits and page tables), so ``advance`` is a few whole-array
operations plus one sampling record per row; only rows that need a new page or leave cost
Python of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from typing import Any, Sequence

import numpy as np

from crucible.step.rows import RowSampling, plain_row
from crucible.step.batch import PAGE_SIZE, PackedBatch, decode_batch, page_tables
from crucible.engine.request import Request
from crucible.engine.scheduler import ScheduledSlice

_NEVER = np.iinfo(np.int64).max  # a plain_from that no counter reaches (penalty rows)


@dataclass
class Launched:
    """A step handed to the runner whose results the engine has not applied yet."""

    slices: tuple[ScheduledSlice, ...]  # scheduled rows, after ``decode``'s when both
    pending: Any  # a runner.PendingStep, or None when ``updates`` are ready
    updates: list | None  # the host sampler's (slice, prompt logits, draw) list
    num_sampled: int  # sampling rows (their ids, in slice order, are the next step's feed)
    decode: DecodeRows | None = None  # a pipelined step's decode rows (rows 0 .. n-1)


@dataclass(frozen=True)
class DecodeRows:
    """A decode step as columns: row i is the one sampling row of ``requests[i]``. The
    arrays are never written once built (a batch handed to the runner shares them)."""

    requests: tuple[Request, ...]
    request_ids: tuple[str, ...]
    positions: np.ndarray  # int64: the row's position (its request's last known token)
    counters: np.ndarray  # int64: tokens generated before this row's draw
    limits: np.ndarray  # int64: generated tokens that end the request by length
    plain_from: np.ndarray  # int64: counters from which its rows carry no entries
    plains: tuple[dict | None, ...]  # Request.plain
    tables: np.ndarray  # int32 [n, w]: each request's pages, zero-padded
    lengths: np.ndarray  # int32 [n]: pages per table
    slow: np.ndarray  # bool: rows whose update always takes the general path
    stop_ids: frozenset[int]  # every stop id of any row


@dataclass(frozen=True)
class ChainedStep:
    decode: DecodeRows
    batch: PackedBatch
    rows: tuple[RowSampling, ...]
    feed: np.ndarray  # per row: its token's index among the previous step's sampled ids


def slice_columns(slices: Sequence[ScheduledSlice], max_context: int) -> DecodeRows:
    """Sampling slices of a launched step as columns: row i is the last row of slice i."""
    n = len(slices)
    reqs = tuple(sl.request for sl in slices)
    pages = [r.page_table.pages for r in reqs]
    lengths = np.fromiter(map(len, pages), np.int32, n)
    tables = page_tables(pages, lengths)
    return DecodeRows(
        requests=reqs, request_ids=tuple(r.request_id for r in reqs),
        positions=np.fromiter((sl.start + sl.length - 1 for sl in slices), np.int64, n),
        counters=np.fromiter((len(r.token_ids) - r.num_prompt_tokens for r in reqs),
                             np.int64, n),
        limits=np.fromiter((min(r.params.max_tokens, max_context - r.num_prompt_tokens)
                            for r in reqs), np.int64, n),
        plain_from=np.fromiter((_NEVER if r.plain is None else r.params.min_tokens
                                for r in reqs), np.int64, n),
        plains=tuple(r.plain for r in reqs), tables=tables, lengths=lengths,
        slow=np.fromiter((_slow(r) for r in reqs), bool, n),
        stop_ids=frozenset().union(*(r.stop_ids for r in reqs)))


def concat_rows(a: DecodeRows, b: DecodeRows) -> DecodeRows:
    """``a``'s rows, then ``b``'s."""
    w = max(a.tables.shape[1], b.tables.shape[1])
    tables = np.zeros((len(a.requests) + len(b.requests), w), np.int32)
    tables[: len(a.requests), : a.tables.shape[1]] = a.tables
    tables[len(a.requests) :, : b.tables.shape[1]] = b.tables
    cat = np.concatenate
    return DecodeRows(a.requests + b.requests, a.request_ids + b.request_ids,
                      cat([a.positions, b.positions]), cat([a.counters, b.counters]),
                      cat([a.limits, b.limits]), cat([a.plain_from, b.plain_from]),
                      a.plains + b.plains, tables, cat([a.lengths, b.lengths]),
                      cat([a.slow, b.slow]), a.stop_ids | b.stop_ids)


def _slow(req: Request) -> bool:
    """Its update needs the general path at every step: logprobs to keep, prompt logprobs,
    or stop strings to look for in its text."""
    return (req.logprobs is not None or req.prompt_logprobs is not None
            or bool(req.params.stop and req.output_text.streams))


def advance(prev: DecodeRows, alive: np.ndarray | None, allocator: Any, max_rows: int,
            allow_empty: bool = False) -> ChainedStep | None:
    """The rows of step t+1 from step t's (``prev``; ``alive``: which of its requests still
    run, None for all), or None when they cannot be planned before t's results: more than
    ``max_rows``, a row that reads t's token (penalties, ``min_tokens``), no page free, or
    (unless ``allow_empty``) no row left."""
    counters = prev.counters + 1  # with step t's token: the next row's draw counter
    keep = counters < prev.limits  # the others end at step t for sure
    if alive is not None:
        keep &= alive
    cols = prev
    if not keep.all():
        cols = DecodeRows(
            tuple(compress(prev.requests, keep)), tuple(compress(prev.request_ids, keep)),
            prev.positions[keep], prev.counters[keep], prev.limits[keep],
            prev.plain_from[keep], tuple(compress(prev.plains, keep)), prev.tables[keep],
            prev.lengths[keep], prev.slow[keep], prev.stop_ids)
        counters = counters[keep]
    n = len(cols.requests)
    if (not n and not allow_empty) or n > max_rows or (counters < cols.plain_from).any():
        return None  # nothing left, too many rows, or penalties / min_tokens read the token
    positions = cols.positions + 1
    tables, lengths = cols.tables, cols.lengths
    grow = np.flatnonzero(positions >= lengths * PAGE_SIZE)  # its last page is full
    if grow.size:
        tables, lengths = tables.copy(), lengths.copy()
        for i in grow.tolist():
            table = cols.requests[i].page_table
            if not table.grow(allocator, int(positions[i]) + 1):
                return None  # no page is free
            k = len(table.pages)
            if k > tables.shape[1]:
                tables = np.pad(tables, ((0, 0), (0, k - tables.shape[1])))
            tables[i, lengths[i] : k] = table.pages[lengths[i] :]
            lengths[i] = k
    if n and tables.shape[1] > (w := max(int(lengths.max()), 1)):  # the widest row ended
        tables = np.ascontiguousarray(tables[:, :w])
    decode = DecodeRows(cols.requests, cols.request_ids, positions, counters, cols.limits,
                        cols.plain_from, cols.plains, tables, lengths, cols.slow,
                        cols.stop_ids)
    rows = tuple([plain_row(p, i, c)
                  for i, (p, c) in enumerate(zip(cols.plains, counters.tolist()))])
    feed = np.flatnonzero(keep).astype(np.int32)
    return ChainedStep(decode, decode_batch(decode.request_ids, positions, tables, lengths),
                       rows, feed)
