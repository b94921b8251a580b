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


def split(dev: Any, sizes: Sequence[int]) -> list[Any]:
    """Consecutive views of ``dev`` with the given lengths."""
    views, offset = [], 0
    for n in sizes:
        views.append(dev[offset : offset + n])
        offset += n
    return views


def device_meta(batch: PackedBatch) -> CupyMeta:
    """An eager step's metadata: built on the host, uploaded in one copy."""
    import cupy as cp

    from crucible.kernels.variants import score_capacity

    slots = batch.slot_mapping()
    parts = [batch.token_ids, batch.positions, (slots >> 4), (slots & 15),
             batch.segments.ravel(), batch.page_tables.ravel(), batch.final_rows]
    host = np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])
    v = split(cp.asarray(host), [len(p) for p in parts])  # the step's one upload
    t = batch.num_rows
    finals = np.asarray(batch.final_rows)
    all_final = finals.shape[0] == t and bool((finals == np.arange(t)).all())
    return CupyMeta(t, v[0], v[1], v[2], v[3], v[4].reshape(batch.segments.shape),
                    v[5].reshape(batch.page_tables.shape), v[6], int(finals.shape[0]),
                    batch.max_chunk, score_capacity(batch.max_end), all_final)
