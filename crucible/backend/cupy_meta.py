"""A step's metadata on the device: int32 columns cut out of one buffer.

Every step uploads its metadata in one host-to-device copy; the kernels read views into
that buffer. Eager steps build it here (``device_meta``); the decode and prefill graphs
keep one buffer per graph at a fixed address and cut the same views out of it
(``split``), so a graph and an eager step see the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from crucible.step.batch import PackedBatch


@dataclass(frozen=True)
class MixedSegments:
    """A mixed step's segments cut in two for attention (kernels/attention.py
    ``paged_attention_mixed``): the one-row segments (running decodes) go to the decode
    kernel, the rest (prefill slices) to the tiled one. Each keeps its own longest chunk
    and score capacity, so neither launch is sized by the other's rows."""

    single: Any  # int32 [D, 4] device view
    multi: Any  # int32 [S - D, 4] device view
    multi_max_chunk: int
    single_capacity: int
    multi_capacity: int


@dataclass(frozen=True)
class CupyMeta:
    num_rows: int
    token_ids: Any
    positions: Any
    pages: Any
    slots: Any
    segments: Any
    page_tables: Any
    final_rows: Any
    num_final: int
    max_chunk: int
    score_capacity: int
    all_final: bool = False  # final_rows == 0..T-1 (a decode step)
    # Pipelined decode (decode graphs only): row t takes its id from fed[feed[t]] when
    # feed[t] >= 0, i.e. from the previous step's sampled ids still on the device.
    feed: Any = None
    fed: Any = None
    mixed: MixedSegments | None = None  # set when the step has both kinds of segment


# attn_decode runs one CTA per (KV head, one-row segment), taken in the order of the
# segment list, and its CTAs' work grows with the row's history. In serving the histories
# of a decode step's rows spread over ~300-2,500 positions; listed as they come, the last
# CTAs to start can be long ones that then run nearly alone, at a fraction of the
# bandwidth. Listed longest first, the last wave is the shortest rows: a 256-row decode
# graph at 300-2,500 positions replays in 0.88x the time (bench/decode-order-h100.json).
# Each CTA finds its row, table and length in its own entry, so the order moves no
# arithmetic (tests/test_gpu_decode_order.py). The decode graphs do it (cupy_graphs.py);
# mixed steps keep their lists in packed order (reordered, their replays took 0.97-1.02x
# the time: docs/gpu-engine.md). Only the exact family's decode kernel is handed a
# reordered list (the reference kernel searches an ascending one), and
# BackendOptions.longest_first (CRUCIBLE_LONGEST_FIRST) turns it off.


def longest_first(segments: np.ndarray) -> np.ndarray:
    """Indices of ``segments`` [S, 4] by descending causal end (absolute start + length),
    stable."""
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 4)
    return np.argsort(-(seg[:, 2] + seg[:, 1]), kind="stable")


def reorders(owner: Any) -> bool:
    """Whether ``owner`` (a CuPy backend, or None) lists attn_decode's rows longest first."""
    return (owner is not None and owner.options.longest_first
            and owner.variant.family == "exact")


def split(dev: Any, sizes: Sequence[int]) -> list[Any]:
    """Consecutive views of ``dev`` with the given lengths."""
    views, offset = [], 0
    for n in sizes:
        views.append(dev[offset : offset + n])
        offset += n
    return views


def _capacity(segments: np.ndarray) -> int:
    from crucible.kernels.variants import score_capacity

    return score_capacity(int((segments[:, 2] + segments[:, 1]).max()))


def device_meta(batch: PackedBatch, feed: np.ndarray | None = None, fed: Any = None
                ) -> CupyMeta:
    """An eager step's metadata: built on the host, uploaded in one copy. ``feed`` (a
    pipelined step): per row, the index into ``fed`` (the previous step's sampled ids on
    the device) of its input id, or -1 for the batch's own."""
    import cupy as cp

    from crucible.kernels.variants import score_capacity

    slots = batch.slot_mapping()
    segs = batch.segments
    one = segs[:, 1] == 1
    n_single = int(one.sum())
    cut = 0 < n_single < segs.shape[0]
    # The kernels read segments as int4: every segment array starts 16-byte aligned, so
    # they all follow the four [T] columns (4T ints) back to back, before anything else.
    single, multi = (segs[one], segs[~one]) if cut else (segs[:0], segs[:0])
    parts = [batch.token_ids, batch.positions, (slots >> 4), (slots & 15), segs.ravel(),
             single.ravel(), multi.ravel(), batch.page_tables.ravel(), batch.final_rows]
    if feed is not None:
        if len(feed) != batch.num_rows or fed is None:
            raise ValueError(f"feed has {len(feed)} entries for a {batch.num_rows}-row step"
                             if fed is not None else "a fed step needs the previous ids")
        parts.append(feed)
    host = np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])
    v = split(cp.asarray(host), [len(p) for p in parts])  # the step's one upload
    t = batch.num_rows
    finals = np.asarray(batch.final_rows)
    all_final = finals.shape[0] == t and bool((finals == np.arange(t)).all())
    mixed = None
    if cut:
        mixed = MixedSegments(v[5].reshape(single.shape), v[6].reshape(multi.shape),
                              int(multi[:, 1].max()), _capacity(single), _capacity(multi))
    return CupyMeta(t, v[0], v[1], v[2], v[3], v[4].reshape(segs.shape),
                    v[7].reshape(batch.page_tables.shape), v[8], int(finals.shape[0]),
                    batch.max_chunk, score_capacity(batch.max_end), all_final,
                    feed=None if feed is None else v[9], fed=fed, mixed=mixed)
