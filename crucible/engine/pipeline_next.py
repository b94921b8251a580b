"""Planning step t+1 from step t's plan, before t's ids reach the host: every pipelined step.

Nothing in a step but its decode rows' input ids depends on step t's results, so the
engine plans step t+1 while t runs and queues it; the host then reads t's ids while the
device computes t+1 (engine/pipeline.py says why the bits are those of the plain engine).
Step t+1 is two parts:

- its decode rows, as columns (pipeline.py ``DecodeRows``): one per request whose row of
  t samples, at the next position, its input id read on the device from t's sampled ids
  (``feed``), its draw counter one more. Step t's sampled rows are columns already (the
  decode rows of a pipelined step, then the columns of its sampling slices), so this is
  pipeline.py's ``advance``: requests t ends for sure are left out, those it may stop (a
  stop id, a stop string) are computed and dropped, a row that reads t's token
  (penalties, ``min_tokens``) or finds no free page sends the step back to the scheduler;
- the rest, as slices after them: requests whose slice of t does not sample go on from
  where t leaves them, running requests t did not touch and waiting ones take the
  scheduler's own rules (``Scheduler.prefill_slice``, ``Scheduler.admit``). In a pure
  decode chain (every running request has a row, nobody waits) there is no rest to look
  for, and planning is a few whole-array operations.

It never preempts. Pages that t's results free (ended requests) or publish (the prefix
cache) are not seen yet: such a plan admits a little less or maps fewer cached pages; no
bit depends on it, since every kernel is batch-invariant. A step whose rows are all known
needs no feed and may replay any graph; a fed step runs where the runner can feed it
(backend/cupy_route.py). Fed steps with slices smaller than ``runner.mixed_feed_rows`` are
not planned (a backend whose graphs take no feed would run them eagerly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from crucible.step.batch import PackedBatch, build_packed_batch, concat_batches
from crucible.step.rows import RowSampling
from crucible.engine.pipeline import DecodeRows, advance, concat_rows, slice_columns
from crucible.engine.request import RequestStatus
from crucible.engine.scheduler import ScheduledSlice, Scheduler
from crucible.engine.step_rows import sampling_rows


@dataclass(frozen=True)
class NextStep:
    decode: DecodeRows | None  # its decode rows as columns (rows 0 .. n-1), fed from t
    slices: tuple[ScheduledSlice, ...]  # the rest, packed after them
    batch: PackedBatch
    rows: Sequence[RowSampling]  # the device sampler's rows
    host_rows: list[int]  # logits rows that come to the host (prompt logprobs)
    feed: np.ndarray | None  # per packed row: index among step t's sampled ids, or -1;
    #                          None when no row is fed


def sampled_columns(cur: Any, max_context: int) -> DecodeRows | None:
    """Step t's sampled rows as columns, row i being its i-th sampled id: its decode rows'
    columns (a pipelined step keeps them), then its sampling slices'."""
    parts = [] if cur.decode is None else [cur.decode]
    sampled = [sl for sl in cur.slices if sl.sample]
    if sampled:
        parts.append(slice_columns(sampled, max_context))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else concat_rows(parts[0], parts[1])


def plan_next(cur: Any, scheduler: Scheduler, max_context: int, vocab_size: int,
              max_fed: int, min_fed_rows: int | None) -> NextStep | None:
    """Step t+1 planned from step t (``cur``, launched, results pending), or None when it
    must wait for t's results (then the scheduler plans it). ``max_fed``: the most sampled
    ids a fed step can read (0: no pipelining); ``min_fed_rows``: the fewest rows worth a
    fed step with slices (None: the runner feeds decode steps only)."""
    if cur.pending is None or not max_fed or cur.num_sampled > max_fed:
        return None
    budget = scheduler.config.token_budget
    live = RequestStatus.RUNNING
    running = scheduler.running
    prev = sampled_columns(cur, max_context)
    dec, whole = None, False
    if prev is not None:
        alive = np.fromiter((r.status is live for r in prev.requests), bool,
                            len(prev.requests))
        # Rows step t ends for sure are left out; a row that reads t's token (penalties,
        # min_tokens) or finds no page sends the step back to the scheduler.
        dec = advance(prev, alive, scheduler.allocator, min(max_fed, budget), True)
        if dec is None:
            return None
        # Every running request has a row of t (prev holds only running or ended ones).
        whole = len(prev.requests) == len(running) and bool(alive.all())
    n_dec = 0 if dec is None else len(dec.decode.requests)
    # The rest: requests t did not sample for, from where t leaves them.
    rest_reqs: list[tuple[Any, int]] = []
    ends = {id(sl.request): sl.start + sl.length for sl in cur.slices if not sl.sample}
    fed = set() if prev is None or whole else {id(r) for r in prev.requests}
    for req in () if whole else running:
        if req.status is not live or id(req) in fed:
            continue
        end = ends.get(id(req))
        if end is not None and req.prompt_logprobs is not None:
            return None  # its prompt logprobs of t are not in yet
        end = req.num_computed_tokens if end is None else end
        if len(req.token_ids) > end:
            rest_reqs.append((req, end))
    budget -= n_dec
    admits = bool(scheduler.waiting) and len(scheduler.running) < scheduler.config.max_running
    if n_dec and (rest_reqs or admits):
        more = sum(len(r.token_ids) - e for r, e in rest_reqs)
        if admits:
            more += sum(len(r.token_ids) for r in scheduler.waiting)
        if min_fed_rows is None or n_dec + min(max(budget, 0), more) < min_fed_rows:
            return None
    slices: list[ScheduledSlice] = []
    for req, start in rest_reqs:
        if budget <= 0:
            break
        sl = scheduler.prefill_slice(req, start, budget)
        if sl is not None:
            slices.append(sl)
            budget -= sl.length
    if budget > 0:
        scheduler.admit(budget, slices)
    if not slices and not n_dec:
        return None
    if not slices:  # a decode step: the columns are the whole of it
        return NextStep(dec.decode, (), dec.batch, dec.rows, [], dec.feed)
    more_rows, host_rows = sampling_rows(slices, vocab_size, row0=n_dec)
    batch = build_packed_batch([sl.segment() for sl in slices])
    if not n_dec:
        return NextStep(None, tuple(slices), batch, more_rows, host_rows, None)
    feed = np.full(batch.num_rows + n_dec, -1, np.int32)
    feed[:n_dec] = dec.feed
    return NextStep(dec.decode, tuple(slices), concat_batches(dec.batch, batch),
                    list(dec.rows) + more_rows, host_rows, feed)
