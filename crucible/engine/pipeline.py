"""Pipelined decode: queue step t+1 before step t's sampled ids reach the host.

A decode step's metadata does not depend on the tokens it feeds: positions, pages and slots
follow from the lengths, and a plain sampling row (no penalties, ``min_tokens`` met) needs
only its draw counter. So when step t is a pure decode (or ends every running request's
prefill) of every running request and nobody waits for admission, the engine can plan step
t+1 from step t's plan alone and queue it; its rows read their input ids from the device,
where step t's sampler wrote them (``ModelRunner.launch_sample(..., feed=...)``). The host
then reads step t's ids while the device computes step t+1, so the host's share of a step
(scheduling, packing, validation, detokenizing) overlaps the device's instead of adding
to it. The tokens are the same bits as without pipelining: every row computes what it
would have computed one step later.

What a request cannot know yet is whether step t stopped it (a stop id, a stop string).
Such a request's row of step t+1 is computed and dropped. That row only writes the K/V of
the request's own last token at the next position, in a page the request owns; a page it
releases afterwards is reused only by steps queued after that row, in stream order.
Requests that step t certainly ends (``max_tokens``, the context) are left out of step t+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.step.rows import RowSampling
from crucible.step.batch import PackedBatch, pack_decodes
from crucible.engine.request import RequestStatus
from crucible.engine.scheduler import ScheduledSlice


@dataclass
class Launched:
    """A step handed to the runner whose results the engine has not applied yet."""

    slices: tuple[ScheduledSlice, ...]
    pending: Any  # a runner.PendingStep, or None when ``updates`` are ready
    updates: list | None  # the host sampler's (slice, prompt logits, draw) list
    num_sampled: int  # sampling rows (their ids, in slice order, are the next step's feed)


@dataclass(frozen=True)
class ChainedStep:
    slices: tuple[ScheduledSlice, ...]
    batch: PackedBatch
    rows: tuple[RowSampling, ...]
    feed: np.ndarray  # per row: its token's index among the previous step's sampled ids


def plan_chained(cur: Launched, running: list, has_waiting: bool, allocator: Any,
                 max_context: int, max_rows: int) -> ChainedStep | None:
    """Step t+1 planned from step t (``cur``), or None when it must wait for step t's
    results (then the scheduler plans it as usual)."""
    if (not max_rows or cur.pending is None or has_waiting or cur.num_sampled > max_rows
            or len(cur.slices) != len(running)):
        return None
    slices, rows, feed, ids, positions, pages = [], [], [], [], [], []
    running_status = RequestStatus.RUNNING
    k = 0  # index of the slice's sampled id in step t
    # (This loop runs for every running request at every pipelined step: names are
    # bound once.)
    for sl in cur.slices:
        req = sl.request
        # Every running request is in step t (same count, each at most once) and samples.
        if not sl.sample or sl.prompt_rows or req.status is not running_status:
            return None
        pos = sl.start + sl.length  # the next row: step t's token at its position
        num_output = len(req.token_ids) - req.num_prompt_tokens + 1  # with step t's token
        k += 1
        params = req.params
        if num_output >= params.max_tokens or pos + 1 >= max_context:
            continue  # step t ends this request for sure
        row = req.plain_row(len(rows), num_output)
        if row is None:
            return None  # penalties / min_tokens read the new token
        table = req.page_table
        if not table.grow(allocator, pos + 1):
            return None  # no page is free
        slices.append(ScheduledSlice(req, pos, 1, (), True))
        ids.append(req.request_id)
        positions.append(pos)
        pages.append(table.pages)  # packed into arrays below, before any change
        rows.append(row)
        feed.append(k - 1)
    if not slices or len(slices) > max_rows:
        return None
    return ChainedStep(tuple(slices), pack_decodes(ids, positions, pages), tuple(rows),
                       np.asarray(feed, np.int32))
