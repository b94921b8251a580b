"""Which way a step runs on the CuPy backend: a CUDA graph of one of three kinds, or eagerly.

Tried in order, the first that takes the step runs it:
1. decode graphs (backend/cupy_graphs.py): every segment one row, every row final, up to
   the largest bucket. They alone read a pipelined step's ids on the device inside a graph;
2. a fed step of any other shape (a pipelined mixed step, engine/pipeline_next.py) takes
   a mixed graph, which copies the ids into its own buffer first, or runs eagerly. Either
   way its embedding reads the previous step's ids from the decode graphs' ``fed`` buffer
   that the previous step's sampler or argmax wrote. The buffer is not flipped: this
   step's own sampler rewrites it only after this step's forward read it (stream order)
   and after the copy of the previous ids went back (the sampler waits for it);
3. singleton prefill graphs (backend/cupy_prefill_graphs.py): one request's slice;
4. mixed graphs (backend/cupy_mixed_graphs.py): prefill slices beside decodes, up to a
   size, with the exact family's split attention only;
5. the rest eagerly. Any graph kind returns None when it cannot take the step (no device
   memory for a capture, a one-off shape): then the next way is tried.

So any step can be fed once the decode graphs exist (``mixed_feed_rows`` 1): a fed step
takes the graph it would have taken unfed, or runs eagerly as it would have.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crucible.backend.cupy_graphs import is_decode_step
from crucible.backend.cupy_meta import device_meta
from crucible.backend.cupy_mixed_graphs import is_mixed_graph_step
from crucible.backend.cupy_prefill_graphs import is_singleton_prefill
from crucible.backend.protocol import GRAPH_STATS, Forward
from crucible.kernels.variants import score_capacity
from crucible.step.batch import PackedBatch


def run_step(be: Any, batch: PackedBatch, forward: Forward,
             feed: np.ndarray | None = None) -> Any:
    """The step's final-row logits on the device (see the module docstring). A step that
    runs out of device memory gets another try once the prefill and mixed graphs and the
    default pool's cached blocks went back to the device, and a last one once the decode
    graphs went too (backend/cupy_memory.py); the same bits land in the same K/V slots
    again."""
    for decode in (False, True):
        try:
            return _route(be, batch, forward, feed)
        except Exception as exc:
            guard = be.memory
            if guard is None or not guard.out_of_memory(exc):
                raise
            guard.release(decode=decode)
            guard.num_retries += 1
    return _route(be, batch, forward, feed)


def _route(be: Any, batch: PackedBatch, forward: Forward, feed: np.ndarray | None) -> Any:
    g = be.graphs
    if feed is not None and g is None:
        raise ValueError("a fed step needs the decode graphs' id buffers")
    if g is not None:
        g.last_replayed = False
        if is_decode_step(batch):
            out = g.run(batch, score_capacity(batch.max_end), forward, feed)
            if out is not None:
                return out
    fed = None if feed is None else g.fed[g.last]  # the previous step's ids
    if feed is None and be.prefill_graphs is not None and is_singleton_prefill(batch):
        out = be.prefill_graphs.run(batch, score_capacity(batch.max_end), forward)
        if out is not None:
            return out
    if mixed_graphs_on(be) and is_mixed_graph_step(batch, be.mixed_graphs.max_tokens):
        out = be.mixed_graphs.run(batch, forward, *(() if feed is None else (feed, fed)))
        if out is not None:
            return out
    return forward(be.prepare(batch) if feed is None else device_meta(batch, feed, fed))


def first_use(be: Any, batch: PackedBatch, fed: bool) -> bool:
    """Whether ``_route`` would capture a graph for the step, or run it eagerly for want of
    one a graph kind would take it with (backend/protocol.py), asked in its order."""
    g, pg = be.graphs, be.prefill_graphs
    if g is not None and is_decode_step(batch):  # a pair is captured on first use
        return g.key(batch.num_rows, score_capacity(batch.max_end)) not in g.graphs
    single = not fed and pg is not None and is_singleton_prefill(batch)
    if single and not pg.is_new(pg.key(batch, score_capacity(batch.max_end))):
        return False  # replayed
    if mixed_graphs_on(be) and is_mixed_graph_step(batch, be.mixed_graphs.max_tokens):
        return be.mixed_graphs.is_new(be.mixed_graphs.key(batch))
    return single  # a new lone prefill that no mixed graph takes


def mixed_graphs_on(be: Any) -> bool:
    return be.mixed_graphs is not None and be.variant.family == "exact"


def mixed_feed_rows(be: Any) -> int | None:
    """The fewest rows of a fed step with prefill slices (None: no fed step at all)."""
    return None if be.graphs is None else 1


def graph_stats(be: Any) -> dict[str, int]:
    """Steps replayed per graph kind, captures of every kind, and the host milliseconds the
    on-demand captures took (prefill and mixed graphs; the decode graphs' come at start-up
    and are reported there): backend/protocol.py GRAPH_STATS."""
    kinds = (be.graphs, be.prefill_graphs, be.mixed_graphs)
    replays = [0 if g is None else int(g.num_replays) for g in kinds]
    captures = sum(int(g.num_captures) for g in kinds if g is not None)
    seconds = sum(g.capture_s for g in kinds[1:] if g is not None)
    guard = getattr(be, "memory", None)
    drops, retries = (0, 0) if guard is None else (guard.num_dropped, guard.num_retries)
    held = sum(g.memory.nbytes for g in kinds if getattr(g, "memory", None) is not None)
    return dict(zip(GRAPH_STATS, (*replays, captures, round(seconds * 1000), drops, retries,
                                  held)))
