"""Pipelined mixed steps: plan step t+1 from step t's plan when t+1 holds prefill slices.

Under load nearly every step packs prefill slices beside the running decodes, and those
steps are where the device used to wait: between two of them the host read step t's ids,
updated hundreds of requests, scheduled, packed and launched (bench/throughput-h200-*.json:
~10% of a 1,000-request run). The decode chain (pipeline.py) cannot plan such a step, since
it holds no prefill and admits nobody; this planner can, because nothing in a mixed step
but its decode rows' input ids depends on step t's results:

- a request whose row of t samples gets a decode row at the next position, its input id
  read on the device from t's sampled ids (``feed``), its draw counter one more than now.
  It must be a plain sampling row (no penalty, ``min_tokens`` met): others read the token;
  then no step is planned. Requests that t certainly ends (``max_tokens``, the context) are
  left out; those t may stop (a stop id, a stop string) are computed and dropped, as in the
  decode chain, and for the same reason that is safe;
- a request whose slice of t does not sample goes on with its prompt from where t leaves it;
- running requests that t did not touch and waiting requests take the scheduler's own
  rules (``Scheduler.prefill_slice``, ``Scheduler.admit``), in the scheduler's order:
  decodes, running prefills, admissions.

It never preempts: when a decode row finds no free page it returns None and the scheduler
plans that step after t's results, as before. Pages that t's results free (ended requests)
or publish (the prefix cache) are not seen yet: such a plan admits a little less or maps
fewer cached pages; no bit depends on it, since every kernel is batch-invariant.

A step whose rows are all known (t sampled nothing that goes on) needs no feed and may
replay any graph. A fed step runs where the runner can feed it: a decode graph, or eagerly
(the CuPy backend's mixed graphs take no feed). Fed steps smaller than
``runner.mixed_feed_rows`` are not planned at all, since a graph replayed after t's results
costs the host less than the eager launches of a fed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch
from crucible.step.rows import RowSampling
from crucible.engine.request import Request, RequestStatus
from crucible.engine.scheduler import ScheduledSlice, Scheduler
from crucible.engine.step_rows import sampling_rows


@dataclass(frozen=True)
class MixedStep:
    slices: tuple[ScheduledSlice, ...]
    batch: PackedBatch
    rows: list[RowSampling]  # the device sampler's rows
    host_rows: list[int]  # logits rows that come to the host (prompt logprobs)
    feed: np.ndarray | None  # per packed row: index among step t's sampled ids, or -1;
    #                          None when no row is fed


def inflight(cur: Any) -> dict[int, tuple[int, int]]:
    """Per request (by ``id``) of step t: (its computed length once t is applied, the index
    of its row among t's sampled ids or -1)."""
    if cur.decode is not None:
        d = cur.decode
        return {id(r): (p + 1, i) for i, (r, p) in
                enumerate(zip(d.requests, d.positions.tolist()))}
    out, k = {}, 0
    for sl in cur.slices:
        out[id(sl.request)] = (sl.start + sl.length, k if sl.sample else -1)
        k += sl.sample
    return out


def plan_mixed(cur: Any, scheduler: Scheduler, max_context: int, vocab_size: int,
               max_fed: int, min_fed_rows: int | None) -> MixedStep | None:
    """Step t+1 planned from step t (``cur``, launched, results pending), or None.
    ``max_fed``: the most sampled ids a fed step can read; ``min_fed_rows``: the fewest rows
    worth a fed step of prefill slices (None: the runner feeds decode graphs only)."""
    if cur.pending is None or not max_fed or cur.num_sampled > max_fed:
        return None
    state = inflight(cur)
    running = scheduler.running
    live = RequestStatus.RUNNING
    fed_rows: list[tuple[Request, int, int]] = []  # (request, position, feed index)
    known_decodes: list[tuple[Request, int]] = []  # (request, position)
    prefills: list[tuple[Request, int]] = []  # (request, start)
    for req in running:
        if req.status is not live:
            continue
        end, k = state.get(id(req), (req.num_computed_tokens, -1))
        if k >= 0:
            n_out = end + 1 - req.num_prompt_tokens  # its output once t's token is in
            if n_out >= req.params.max_tokens or end + 1 >= max_context:
                continue  # t ends it for sure
            fed_rows.append((req, end, k))
        elif len(req.token_ids) - end == 1:
            if req.prompt_logprobs is not None:
                return None  # its row may carry prompt rows: the scheduler's to plan
            known_decodes.append((req, end))
        elif len(req.token_ids) > end:
            if id(req) in state and req.prompt_logprobs is not None:
                return None  # its prompt logprobs of t are not in yet
            prefills.append((req, end))
    budget = scheduler.config.token_budget
    admits = bool(scheduler.waiting) and len(running) < scheduler.config.max_running
    if fed_rows and (prefills or admits):
        rest = sum(len(r.token_ids) - s for r, s in prefills)
        if admits:
            rest += sum(len(r.token_ids) for r in scheduler.waiting)
        n_dec = len(fed_rows) + len(known_decodes)
        if min_fed_rows is None or n_dec + min(max(budget - n_dec, 0), rest) < min_fed_rows:
            return None
    rows: list[RowSampling] = []
    fed_at: list[tuple[int, int]] = []  # (packed row, feed index)
    slices: list[ScheduledSlice] = []
    specs: list[SegmentSpec] = []
    alloc = scheduler.allocator
    # The scheduler's order: decodes (running order), running prefills, admissions. Fed and
    # known decodes keep the running list's order among themselves.
    order = {id(r): i for i, r in enumerate(running)}
    decodes = sorted([(order[id(r)], r, p, k) for r, p, k in fed_rows] +
                     [(order[id(r)], r, p, -1) for r, p in known_decodes],
                     key=lambda x: x[0])
    row = 0
    for _, req, pos, k in decodes:
        if budget == 0:
            break
        if not req.page_table.grow(alloc, pos + 1):
            return None  # the scheduler decides whom to preempt, after t's results
        sl = ScheduledSlice(req, pos, 1, (), True)
        if k >= 0:  # decodes come first: row i of the step is logits row i
            meta = req.plain_row(row, pos + 1 - req.num_prompt_tokens)
            if meta is None:
                return None  # penalties or min_tokens read the token it does not have
            rows.append(meta)
            fed_at.append((row, k))
            specs.append(SegmentSpec(req.request_id, (0,), pos, req.page_table.pages, (0,)))
        else:  # its token is known: the usual row
            rows += sampling_rows([sl], vocab_size, row0=row)[0]
            specs.append(sl.segment())
        slices.append(sl)
        row += 1
        budget -= 1
    n_dec = len(slices)
    for req, start in prefills:
        if budget == 0:
            break
        sl = scheduler.prefill_slice(req, start, budget)
        if sl is not None:
            slices.append(sl)
            budget -= sl.length
    scheduler.admit(budget, slices)
    if not slices:
        return None
    rest = slices[n_dec:]
    specs += [sl.segment() for sl in rest]
    more, host_rows = sampling_rows(rest, vocab_size, row0=row)
    feed = _feed(row + sum(sl.length for sl in rest), fed_at) if fed_at else None
    return MixedStep(tuple(slices), build_packed_batch(specs), rows + more, host_rows, feed)


def _feed(num_rows: int, fed_at: list[tuple[int, int]]) -> np.ndarray:
    feed = np.full(num_rows, -1, np.int32)
    at = np.asarray(fed_at, np.int64)
    feed[at[:, 0]] = at[:, 1]
    return feed
