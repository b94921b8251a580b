"""CUDA graphs for singleton prefill steps: one request's prompt chunk, alone in its step.

A chat turn's prompt usually arrives alone (nothing else is running), and eagerly its
forward costs one Python-side launch per kernel: more host time than GPU time for prompts
of a few hundred tokens. A graph replays the whole forward with one launch.

A step qualifies when it holds exactly one segment of more than one row whose final rows
are either none (a middle chunk) or just its last row. Its graph is keyed by
``(length, want_logits, score capacity)``, the things that shape the kernel launches (under
the spread rule, kernels/capacity.py, the capacity widened to its grid's class); the
request's tokens, positions, slots and page table are data, refilled in one host-to-device
copy before each replay. A key is captured the second time it is seen: a capture costs a few
eager forwards, and a server's prompts mostly have lengths never seen again (captured on
first sight, each new length made its request's first token wait for a capture). At most
``MAX_GRAPHS`` are kept and none is evicted: once full, a new key runs eagerly (a workload
with many distinct lengths would otherwise recapture all the time); after a capture runs
out of device memory, at most half as many as were held. Prompts longer than ``MAX_LENGTH``
always run eagerly. Padding is never needed, so replay == eager bit for bit by
construction (``gpu-graph-check`` checks it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from crucible.backend.cupy_capture import capture_forward
from crucible.backend.cupy_graph_cache import GraphCache
from crucible.backend.cupy_meta import CupyMeta, split
from crucible.backend.cupy_pinned import PinnedRing
from crucible.kernels.capacity import OwnedClasses
from crucible.step.batch import PackedBatch

MAX_GRAPHS = 64
CAPTURE_AFTER = 2  # sightings of a key before it is captured
MAX_LENGTH = 2048


def is_singleton_prefill(batch: PackedBatch) -> bool:
    if batch.num_segments != 1 or not 1 < batch.num_rows <= MAX_LENGTH:
        return False
    finals = batch.final_rows
    return finals.shape[0] == 0 or (finals.shape[0] == 1 and finals[0] == batch.num_rows - 1)


class PrefillGraphs(GraphCache):
    def __init__(self, table_width: int, scratch_page: int, owner: Any = None) -> None:
        import cupy as cp

        self.width = table_width
        self.scratch = scratch_page
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.ring = PinnedRing()  # page-locked metadata staging (cupy_pinned.py)
        self._init_cache(CAPTURE_AFTER, MAX_GRAPHS)
        # ``owner`` (the backend) sizes the capacity classes (kernels/capacity.py)
        self.classes = None if owner is None else OwnedClasses(owner, table_width)

    def host_meta(self, batch: PackedBatch | None, length: int, want: bool) -> np.ndarray:
        """Tokens, positions, pages, slots, the segment, the page table, the final row."""
        if batch is None:  # capture-time stand-in: every position on the scratch page
            tok, pos = np.zeros(length, np.int32), np.arange(length, dtype=np.int32)
            pages, slots = np.full(length, self.scratch, np.int32), pos & 15
            seg = np.array([0, length, 0, 0], np.int32)
            table = np.full(self.width, self.scratch, np.int32)
        else:
            s = batch.slot_mapping()
            tok, pos, pages, slots = batch.token_ids, batch.positions, s >> 4, s & 15
            seg = batch.segments[0]
            table = np.zeros(self.width, np.int32)
            table[: batch.page_tables.shape[1]] = batch.page_tables[seg[3]]
            seg = np.array([seg[0], seg[1], seg[2], 0], np.int32)
        finals = np.array([length - 1] if want else [], np.int32)
        return np.concatenate([np.asarray(a, np.int32) for a in
                               (tok, pos, pages, slots, seg, table, finals)])

    def _views(self, meta_dev: Any, length: int, want: bool, capacity: int) -> Any:
        v = split(meta_dev, [length] * 4 + [4, self.width, 1 if want else 0])
        return CupyMeta(length, v[0], v[1], v[2], v[3], v[4].reshape(1, 4),
                        v[5].reshape(1, self.width), v[6], 1 if want else 0, length, capacity)

    def key(self, batch: PackedBatch, capacity: int) -> tuple[int, bool, int]:
        """(rows, whether the last row samples, the score capacity it replays at)."""
        length, want = batch.num_rows, batch.final_rows.shape[0] == 1
        classes = None if self.classes is None else self.classes.get()
        if classes is not None and classes.spread:  # (kernels/capacity.py; off by default)
            capacity = classes.slices(capacity, length, 1)
        return length, want, capacity

    def run(self, batch: PackedBatch, capacity: int,
            forward: Callable[[Any], Any]) -> Any | None:
        """The step's logits on the device, or None when it must run eagerly."""
        import cupy as cp

        key = length, want, capacity = self.key(batch, capacity)

        def capture() -> Any:
            meta_dev = cp.asarray(self.host_meta(None, length, want))
            return capture_forward(forward, self.stream, meta_dev,
                                   self._views(meta_dev, length, want, capacity), self.memory,
                                   wait=False)

        cap = self._graph(key, capture)
        if cap is None:
            return None
        logits = cap.replay(self.stream, self.host_meta(batch, length, want), self.ring)
        self.num_replays += 1
        return logits
