"""CUDA graphs for decode steps, bucketed by batch size.

A decode step (every segment one row, every row final) of ``b`` rows replays the graph of
the smallest bucket ``B >= b``. The ``B - b`` padding rows are complete, valid requests of
their own: token 0 at position 0, whose one page is a scratch page past the engine's pool
(the backend allocates ``num_pages + 1``). Each kernel computes a row from that row's own
data, so padding rows cannot change real rows; they all write the same bits into the same
scratch slot.

Graphs come in twins keyed by (bucket, capacity class), since the attention launch depends
on both. The classes are 2048 positions, then every 1024 up to the context
(``graph_capacity``): attn_decode's loops run to each row's own length and only its shared
score buffer is sized by the capacity, so a coarse class costs the device nothing while
the buffer still lets 2 CTAs share an SM (up to ~6,600 positions with 3 heads a CTA; a
class of the next power of two would have cost that from 4,097); a class per 256
positions made every growing history cross into a new key and recapture mid-run.
``capture_all`` captures every bucket of the first class at start-up.

Everything a graph touches lives at fixed addresses: its int32 metadata buffer, the memory
every decode graph shares (activations, logits: cupy_graph_memory.py), and the two ``fed``
buffers. A graph ends with the greedy argmax of every row (cuda/sampling_greedy.cu), so a
step whose rows are all plain greedy needs no sampling launch: the ids are already in
``fed``, and only the copy back is queued (``sampled_ids``). Other steps' samplers write
their ids over them.

Why twins: a pipelined step t+1 reads step t's ids from ``fed`` while step t's ids are still
being copied back to the host. Twin q reads ``fed[1 - q]`` (the previous step's ids: the
metadata's ``feed`` column says which; -1 takes the batch's own id) and writes ``fed[q]``;
consecutive steps alternate twins. So a graph only has to wait for the copy of the ids two
steps back (long done), never the previous step's, and its metadata buffer is not the one
the previous step is still reading, so the next step's metadata goes up on a stream of its
own while the previous step runs. Replays go on the default stream, where the sampler and
eager steps run: no hop between streams on the critical path. (Captures need a stream of
their own.) Both twins are captured when a key is first needed. At most ``MAX_PAIRS`` keys
are kept; the oldest is dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from crucible.backend.cupy_capture import Captured, capture_forward
from crucible.backend.cupy_graph_memory import GraphMemory
from crucible.backend.cupy_meta import CupyMeta, longest_first, reorders, split
from crucible.backend.cupy_pinned import PinnedRing
from crucible.backend.options import DECODE_GRAPH_ROWS
from crucible.kernels.capacity import OwnedClasses
from crucible.kernels.decode_stack import MAX_ROWS as STACK_ROWS
from crucible.kernels.variants import score_capacity
from crucible.step.batch import PackedBatch

# Up to the default max_running (options.DECODE_GRAPH_ROWS): under load most decode
# steps have hundreds of rows, and eagerly such a step costs ~9 ms of launches on the host
# (bench/mixed-step-h200.json, "decode 256"). Steps past 64 rows pad by at most a quarter.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 448,
           DECODE_GRAPH_ROWS)
MAX_PAIRS = 32  # (bucket, capacity) keys, two graphs each
CAPACITY_FLOOR = 2048  # the first capacity class (positions)
CAPACITY_STEP = 1024  # the classes past it


def graph_capacity(capacity: int, ceiling: int) -> int:
    """The capacity class a decode step of score capacity ``capacity`` replays: 2048, then
    multiples of 1024, never past ``ceiling`` (the context's capacity) nor below
    ``capacity``."""
    c = max(CAPACITY_FLOOR, -(-capacity // CAPACITY_STEP) * CAPACITY_STEP)
    return max(capacity, min(c, ceiling))


def is_decode_step(batch: PackedBatch) -> bool:
    s = batch.segments
    return (batch.num_segments > 0 and bool((s[:, 1] == 1).all())
            and batch.final_rows.shape[0] == batch.num_rows
            and batch.num_rows <= BUCKETS[-1])


class DecodeGraphs:
    classes: OwnedClasses | None = None  # (fakes built without __init__ have none)
    owner: Any = None

    def __init__(self, vocab_size: int, table_width: int, scratch_page: int,
                 owner: Any = None) -> None:
        import cupy as cp

        from crucible.kernels.sampling_greedy import GreedyLauncher

        self.vocab = vocab_size
        self.width = table_width  # pages of one full context: the widest table a graph holds
        self.ceiling = score_capacity(table_width * 16)  # the context's score capacity
        # ``owner`` (the backend) sizes the spread rule's classes (capacity_class)
        self.classes = None if owner is None else OwnedClasses(owner, table_width)
        self.owner = owner  # its options and variant: the rows' order (cupy_meta.reorders)
        self.scratch = scratch_page
        self.stream = cp.cuda.Stream(non_blocking=True)  # captures
        self.upload = cp.cuda.Stream(non_blocking=True)  # metadata, ahead of the replays
        self.graphs: OrderedDict[tuple[int, int], tuple[Captured, Captured]] = OrderedDict()
        self.memory = GraphMemory()  # every pair's intermediates and logits (one forward's)
        self.num_captures = 0
        self.num_out_of_memory = 0  # captures abandoned for want of device memory
        self.num_replays = 0
        self._templates: dict[tuple[int, int], np.ndarray] = {}
        self.fed = (cp.zeros(BUCKETS[-1], dtype=cp.int32), cp.zeros(BUCKETS[-1], dtype=cp.int32))
        self.last = 0  # fed[last] holds the latest step's ids
        self.last_replayed = False  # whether the latest step was a replay (its argmax ran)
        self._read: list[Any] = [None, None]  # per fed buffer: its last copy back's event
        self._warm_ids = cp.zeros(BUCKETS[-1], dtype=cp.int32)  # the warm-up argmax's target
        self.argmax = GreedyLauncher()
        # Sized once for the largest bucket: a capture must not reallocate its scratch.
        self.argmax.reserve(BUCKETS[-1], vocab_size)
        self.ring = PinnedRing()
        self.make_room: Callable[[], bool] | None = None  # cupy_memory.MemoryGuard's

    def clear(self) -> None:
        """Drop every pair; their shared memory goes back to the device."""
        self.stream.synchronize()
        self.graphs.clear()
        self.memory.release()

    def capacity_class(self, capacity: int, bucket: int) -> int:
        """The capacity a bucket's step replays at: ``graph_capacity``'s class, under the
        spread rule (kernels/capacity.py, off by default) widened to the bucket's grid
        class past the batch-1 stack's rows, whose attention also stages W_o beside the
        scores (kernels/decode_stack.py fits it to the capacity)."""
        c = graph_capacity(capacity, self.ceiling)
        classes = None if self.classes is None or bucket <= STACK_ROWS else self.classes.get()
        return classes.decode(c, bucket) if classes is not None and classes.spread else c

    def table_width(self, capacity: int) -> int:
        """Page-table columns a graph of score capacity ``capacity`` holds: every position
        its attention reads is below the capacity, so pages past capacity / 16 are never
        read. (A full-context width would make a 64-row step upload 128 KiB of tables.)"""
        return min(self.width, -(-capacity // 16))

    def host_meta(self, batch: PackedBatch | None, bucket: int, width: int,
                  feed: np.ndarray | None = None) -> np.ndarray:
        """The bucket's metadata, real rows first, then padding rows. Built from a cached
        all-padding template, so a step only writes its real rows (this runs every step)."""
        template = self._templates.get((bucket, width))
        if template is None:
            template = self._padding_meta(bucket, width)
            self._templates[(bucket, width)] = template
        if batch is None:
            return template.copy()
        out = template.copy()
        b, w = batch.num_rows, width
        pos = batch.positions
        # A decode step: row i is segment i, so row i's page table is that segment's table
        # and its slot is (table[pos >> 4], pos & 15): no general slot mapping needed.
        rows_tables = batch.page_tables[batch.segments[:, 3]]
        out[0:b] = batch.token_ids
        out[bucket : bucket + b] = pos
        out[2 * bucket : 2 * bucket + b] = rows_tables[np.arange(b), pos >> 4]
        out[3 * bucket : 3 * bucket + b] = pos & 15
        seg = out[4 * bucket : 8 * bucket].reshape(bucket, 4)
        if bucket > STACK_ROWS and reorders(self.owner):
            # attn_decode takes the rows longest first (cupy_meta.py); the batch-1 stack's
            # O partials are indexed by entry, so its buckets keep row order.
            order = longest_first(batch.segments)
            seg[:b, 0], seg[:b, 2], seg[:b, 3] = order, batch.segments[order, 2], order
        else:
            seg[:b, 2] = batch.segments[:, 2]
        tables = out[8 * bucket : 8 * bucket + bucket * w].reshape(bucket, w)
        tables[:b] = 0
        used = min(w, rows_tables.shape[1])  # pages grown ahead of the position stay out
        tables[:b, :used] = rows_tables[:, :used]
        if feed is not None:
            if len(feed) != b:
                raise ValueError(f"feed has {len(feed)} entries for a {b}-row step")
            out[9 * bucket + bucket * w : 9 * bucket + bucket * w + b] = feed
        return out

    def _padding_meta(self, bucket: int, width: int) -> np.ndarray:
        """Every row a padding request: token 0 at position 0 on the scratch page."""
        tok, pos = np.zeros(bucket, np.int32), np.zeros(bucket, np.int32)
        page = np.full(bucket, self.scratch, np.int32)
        slot = np.zeros(bucket, np.int32)
        seg = np.stack([np.arange(bucket), np.ones(bucket), np.zeros(bucket),
                        np.arange(bucket)], axis=1).astype(np.int32)
        tables = np.zeros((bucket, width), np.int32)
        tables[:, 0] = self.scratch
        finals = np.arange(bucket, dtype=np.int32)
        feed = np.full(bucket, -1, np.int32)
        return np.concatenate([tok, pos, page, slot, seg.ravel(), tables.ravel(), finals, feed])

    def _views(self, meta_dev: Any, bucket: int, capacity: int, twin: int) -> Any:
        w = self.table_width(capacity)
        v = split(meta_dev, [bucket] * 4 + [bucket * 4, bucket * w, bucket, bucket])
        return CupyMeta(bucket, v[0], v[1], v[2], v[3], v[4].reshape(bucket, 4),
                        v[5].reshape(bucket, w), v[6], bucket, 1, capacity, True,
                        feed=v[7], fed=self.fed[1 - twin])

    def _capture(self, bucket: int, capacity: int, twin: int,
                 forward: Callable[[Any], Any]) -> Captured:
        import cupy as cp

        meta_dev = cp.asarray(self.host_meta(None, bucket, self.table_width(capacity)))

        def argmax(logits: Any, warm_up: bool) -> None:
            self.argmax.launch(logits, None, bucket, self._warm_ids if warm_up else self.fed[twin])

        cap = capture_forward(forward, self.stream, meta_dev,
                              self._views(meta_dev, bucket, capacity, twin), self.memory,
                              tail=argmax)
        self.num_captures += 1
        return cap

    def _pair(self, bucket: int, capacity: int,
              forward: Callable[[Any], Any]) -> tuple[Captured, Captured]:
        key = (bucket, capacity)
        pair = self.graphs.get(key)
        if pair is None:
            # Room first (cupy_memory.py): the other graphs, then the oldest pairs, go back
            # to the device rather than leave a step too little to run in.
            if self.make_room is not None:
                self.make_room()
            # Both twins at once: which one a later step needs depends on the parity of every
            # step before it, and a twin captured on demand costs a step the whole capture.
            pair = (self._capture(bucket, capacity, 0, forward),
                    self._capture(bucket, capacity, 1, forward))
            self.graphs[key] = pair
            if len(self.graphs) > MAX_PAIRS:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        return pair

    def capture_all(self, forward: Callable[[Any], Any], max_rows: int) -> int:
        """Capture both twins of every bucket up to ``max_rows``'s at the first capacity
        class, before any request (the engine's start-up): graphs a server replays all the
        time are then never captured inside a step someone waits for. Returns how many.

        Largest first: the shared pool (cupy_graph_memory.py) grows to the largest working
        set at once and every smaller capture fits in its blocks. Smallest first, each
        larger capture found only smaller free blocks and added its own: the 19 pairs held
        2.35x what the 512-row pair alone does (H100, tests/test_gpu_graph_memory.py)."""
        import cupy as cp

        before = self.num_captures
        top = next((x for x in BUCKETS if x >= max_rows), BUCKETS[-1])
        # The shared logits buffer at its final size: an outgrown one would live on with
        # the graphs that write it.
        self.memory.logits(top, self.vocab)
        for bucket in reversed([b for b in BUCKETS if b <= top]):
            try:
                self._pair(bucket, self.capacity_class(256, bucket), forward)
            except cp.cuda.memory.OutOfMemoryError:
                # What was captured stays; the rest is captured (or run eagerly) as needed.
                self.num_out_of_memory += 1
                break
        return self.num_captures - before

    def key(self, rows: int, capacity: int) -> tuple[int, int]:
        """(bucket, capacity class) of the pair a decode step of ``rows`` replays."""
        bucket = next(x for x in BUCKETS if x >= rows)
        return bucket, self.capacity_class(capacity, bucket)

    def run(self, batch: PackedBatch, capacity: int, forward: Callable[[Any], Any],
            feed: np.ndarray | None = None) -> Any | None:
        """The step's logits (replayed), or None when no graph could be captured for want
        of device memory and the step must run eagerly."""
        import cupy as cp

        b = batch.num_rows
        bucket, capacity = self.key(b, capacity)
        try:
            pair = self._pair(bucket, capacity, forward)
        except cp.cuda.memory.OutOfMemoryError:
            # Every graph's memory goes back to the device; then one more try. A step
            # that still finds no room runs eagerly, unless it is fed (only graphs read the
            # previous step's ids on the device).
            self.num_out_of_memory += 1
            self.clear()
            try:
                pair = self._pair(bucket, capacity, forward)
            except cp.cuda.memory.OutOfMemoryError:
                self.clear()
                if feed is not None:
                    raise
                return None
        twin = 1 - self.last
        meta = self.host_meta(batch, bucket, self.table_width(capacity), feed)
        # The graph's argmax rewrites fed[twin]: the ids copied from it two steps back must
        # be on the host first (that copy ended while the previous step ran).
        logits = pair[twin].replay_default(meta, self.ring, self.upload, self._read[twin])
        self.last, self.last_replayed = twin, True
        self.num_replays += 1
        return logits[:b]

    def fed_ids(self, rows: int) -> Any:
        """Where the latest step's ids are (a replay's argmax) or go (its sampler)."""
        return self.fed[self.last] if rows <= BUCKETS[-1] else None

    def copied(self, event: Any) -> None:
        """The latest step's ids are being copied back until ``event``: the next writer of
        their buffer (the replay after next) waits for it."""
        self._read[self.last] = event
