"""CUDA graphs for packed mixed steps: prefill slices and decode rows in one forward.

Under moderate load (tens of running requests, a chat turn's prompt arriving) most steps
hold a few prefill slices beside the running decodes. Eagerly such a step costs ~9 ms of
host-side launches whatever its size (bench/mixed-step-h200.json), several times its GPU
time when it is small. A graph replays it with one launch.

A step qualifies when it has at most ``max_tokens`` rows (``MAX_TOKENS`` unless
``CRUCIBLE_MIXED_GRAPH_ROWS`` says otherwise: one of options.MIXED_GRAPH_ROWS) and at most
``MAX_SLICES`` segments of more than one row. It is padded to a graph's shape, the key
``(tokens, finals, tile slots, TILE, decode capacity, slice capacity)``. The buckets are
coarse on purpose: chat traffic makes steps of every size, and each key costs a capture (a
warm-up forward and the capture itself, ~15 ms of host time on the critical path of every
request waiting for that step). So the rows round to TOKEN_BUCKETS; the final rows to a
power of two of at least FINALS_FLOOR (the LM head's few padded rows cost less than the
captures a second dimension made); and each launch's score capacity to its class: the
largest at which its kernel still fits as many CTAs an SM (kernels/capacity.py; a larger
score buffer changes no bits, only shared memory).
The slices are listed as tiles of TILE rows (``slice_tiles``): a slice of n rows is
ceil(n / TILE) entries of its own rows, starts and page table, each a segment of its own
to the tiled kernel, which launches one row tile per entry. A row's arithmetic depends on
its absolute position and pages alone (the kernels are chunk-invariant: DESIGN.md 5), so
the bits are the eager step's. The list has ``tile_slots(tokens)`` entries whatever the
slices' count and lengths, so neither is a key dimension: while the grid was (longest
slice, slices), a chat server's steps made a new key from each mix of slice counts and
lengths, and on the H200 a cached chat run still captured 3-4 graphs and ran 4-8 steps
eagerly inside its timed turns (docs/prefix-cache.md).
Up to 16 slices: a chat server's turns arrive in cohorts (the users whose replies ended in
one step), so a step holds a dozen or more ~100-token slices beside the decodes; while at
most 4 were taken, such steps ran eagerly, ~9.4 ms of host launches for ~5 ms of GPU work
on the H200 (bench/chat_timeline.py, docs/prefix-cache.md).
The decode rows' launch and the slices' each get their own capacity, the decode rows'
longest history and the slices' longest end (at least SLICE_CAPACITY_FLOOR), as an eager
step sizes each launch by its own rows (cupy_meta.MixedSegments). Sized by the decode
rows' longest history, the exact tiled kernel's score buffer left one CTA an SM instead of
three past 1,024 positions (kernels/variants.py plan_launch: 119 KB at 2,048, 70 KB at
1,024), which cost 1,024-row mixed graphs 12% of the random workload
(bench/mixed-graph-rows-mma-h200.json). Powers of two did the same in a chat server's
common case, slices ending at 1,025-2,048 (C = 2,048: one CTA an SM where 1,792 fits two);
the classes keep each launch's occupancy. bench/mixed_graph_keys.py counts the keys each
rule makes:
- rows: real rows first as packed, then padding rows (token 0 at position 0 on the scratch
  page past the pool, like the decode graphs' padding requests);
- one-row segments: a list of ``tokens`` entries: the step's decode rows, then one per
  padding row (attending to its one scratch position), then empty entries (chunk_len 0,
  whose CTAs exit at once: cuda/attention_decode.cu);
- slice tiles: ``tile_slots(tokens)`` entries, each slice's tiles in a row (its last
  tile first, the order the tiled kernel's grid took them in when it covered whole
  slices: the longest history first), then empty ones (chunk_len 0, exiting at once);
- final rows: ``finals`` entries, the padding ones pointing at row 0 (computed, not read);
- feed: ``tokens`` entries, -1 (the row's own id) but for a pipelined step's decode rows,
  whose ids the graph reads from ``fed_in``: a buffer of its own at a fixed address, into
  which a fed replay first copies the previous step's ids (engine/pipeline_next.py);
- page tables: one row per real segment, then the scratch row; only the rows in use are
  uploaded (the rest of the buffer is never read: no segment points at it).
Attention runs split as in eager mixed steps (kernels/attention.py paged_attention_mixed),
so every real row's arithmetic is the eager step's, and padding rows only ever read and
write the scratch page: replay == eager bit for bit (``gpu-graph-check`` checks it).
Steps of more than ``max_tokens`` rows run eagerly: their GPU time (~24 ms for 1,024 rows
with 500 decodes) hides the launches, and each graph of that size costs a capture of a
whole step. Serving makes steps just past 512 rows (a few hundred decodes beside a prompt's
slice), which launch eagerly without PDL between kernels; 1,024 covers them (measured
choice pending: docs/throughput.md). Up to 2,048 rows (the offline default's token budget)
is allowed for when those steps' GPU time falls below their eager launches (a faster GEMM:
docs/throughput.md, "The warpgroup MMA"); each such graph holds a 2,048-row forward's
working set, and a capture that runs out of memory drops the graphs as above.

Captures are bounded, so a stream of ever-new shapes can never make every step a capture:
a key is captured the ``CAPTURE_AFTER``-th time it is seen (a one-off shape runs eagerly),
and once ``MAX_GRAPHS`` are held no more are made (nothing is evicted to make room, which
would thrash); those steps run eagerly and are counted (``num_eager``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from crucible.backend.cupy_capture import capture_forward
from crucible.backend.cupy_graph_cache import GraphCache
from crucible.backend.cupy_graphs import BUCKETS
from crucible.backend.cupy_meta import CupyMeta, MixedSegments, split
from crucible.backend.cupy_pinned import PinnedRing
from crucible.backend.options import MIXED_GRAPH_ROWS
from crucible.kernels.capacity import OwnedClasses
from crucible.step.batch import PackedBatch

MAX_TOKENS = 512  # the default max_tokens
MAX_SLICES = 16
MAX_GRAPHS = 32
CAPTURE_AFTER = 2  # sightings of a key before it is captured
TOKEN_BUCKETS = (16, 32, 64, 128, 192, 256, 384, 512, 640, 768, 1024, 1280, 1536, 2048)
FINAL_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
assert set(MIXED_GRAPH_ROWS) <= set(TOKEN_BUCKETS)  # what max_tokens may be: buckets
TILE = 4  # rows of a slice tile: the tiled kernels' most rows a CTA (variants.ROWS_CHOICES)
FINALS_FLOOR = 128
CAPACITY_BUCKETS = tuple(256 << i for i in range(8))  # 256 .. 32,768
# The slices' launch: every capacity up to 1,024 gives the plain exact tiled kernel its three
# CTAs an SM (registers bind first), so below that one bucket does (fewer keys); the
# prefetching instance (variants.PREFETCH) holds two up to 1,792, its class.
SLICE_CAPACITY_FLOOR = 1024
FED_ROWS = BUCKETS[-1]  # ids a fed step can read: the decode graphs' largest bucket

Key = tuple[int, int, int, int, int, int]


def _up(x: int, buckets: tuple[int, ...]) -> int:
    return next((b for b in buckets if b >= x), -(-x // buckets[-1]) * buckets[-1])


def _end(segments: np.ndarray) -> int:
    """The segments' longest absolute end (at least 1)."""
    return max(1, int((segments[:, 2] + segments[:, 1]).max())) if segments.shape[0] else 1


def _capacity(segments: np.ndarray) -> int:
    return _up(_end(segments), CAPACITY_BUCKETS)


def tile_slots(tokens: int) -> int:
    """Entries of a ``tokens``-row graph's tile list: every slice's rows in tiles, and one
    partial tile per slice at most."""
    return -(-tokens // TILE) + MAX_SLICES


def slice_tiles(multi: np.ndarray, first_table: int) -> np.ndarray:
    """The slices ``multi`` [m, 4] as tiles of TILE rows [n, 4]: (packed start, rows,
    absolute start, table row), slice i's table row ``first_table + i``; each slice's
    tiles last first."""
    lens = -(-multi[:, 1] // TILE)
    which = np.repeat(np.arange(multi.shape[0]), lens)
    # tile j of its slice, counted from the slice's last tile
    j = np.repeat(np.cumsum(lens), lens) - 1 - np.arange(int(lens.sum()))
    off = TILE * j
    return np.stack([multi[which, 0] + off, np.minimum(TILE, multi[which, 1] - off),
                     multi[which, 2] + off, first_table + which], axis=1).astype(np.int32)


def is_mixed_graph_step(batch: PackedBatch, max_tokens: int = MAX_TOKENS) -> bool:
    """Whether a step can replay a mixed graph: some slice of more than one row, at most
    MAX_SLICES of them, at most ``max_tokens`` rows (decode steps and lone prefills have
    graphs of their own, tried first)."""
    if not 0 < batch.num_rows <= max_tokens:
        return False
    n_multi = int((batch.segments[:, 1] > 1).sum())
    return 0 < n_multi <= MAX_SLICES


class MixedGraphs(GraphCache):
    _keyed: tuple[Any, Any] = (None, None)  # the latest batch and its key

    def __init__(self, table_width: int, scratch_page: int,
                 max_tokens: int = MAX_TOKENS, owner: Any = None) -> None:
        import cupy as cp

        if max_tokens not in MIXED_GRAPH_ROWS:
            raise ValueError(f"mixed graphs: max_tokens {max_tokens} is not one of "
                             f"{MIXED_GRAPH_ROWS}")
        self.max_tokens = max_tokens
        self.width = table_width  # pages of one full context
        # ``owner`` (the backend: its cfg and variant) sizes the launches' score-capacity
        # classes; without one, powers of two.
        self.classes = None if owner is None else OwnedClasses(owner, table_width)
        self.scratch = scratch_page
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.ring = PinnedRing()
        self._init_cache(CAPTURE_AFTER, MAX_GRAPHS)
        # A pipelined step's rows read the previous step's ids from here: every graph reads
        # this one buffer, refilled before a fed replay from where those ids are.
        self.fed_in = cp.full(FED_ROWS, 0, dtype=cp.int32)

    def key(self, batch: PackedBatch) -> Key:
        if self._keyed[0] is batch:  # asked by cupy_route.first_use, then by run
            return self._keyed[1]
        key = self._key(batch)
        self._keyed = (batch, key)
        return key

    def _key(self, batch: PackedBatch) -> Key:
        segs = batch.segments
        multi = segs[segs[:, 1] > 1]
        t = _up(batch.num_rows, TOKEN_BUCKETS)
        f = min(t, max(FINALS_FLOOR, _up(int(batch.final_rows.shape[0]), FINAL_BUCKETS)))
        s = tile_slots(t)
        classes = None if self.classes is None else self.classes.get()
        if classes is None:  # powers of two (host-only tests; the rule before the classes)
            cap = _capacity(segs)
            return (t, f, s, TILE, cap,
                    min(cap, max(SLICE_CAPACITY_FLOOR, _capacity(multi))))
        single = segs[segs[:, 1] == 1]
        return (t, f, s, TILE, classes.decode(_end(single), t),
                classes.slices(max(SLICE_CAPACITY_FLOOR, _end(multi)), TILE, s))

    def _sizes(self, key: Key) -> tuple[int, int, list[int]]:
        """(table width, table rows, the buffer's part sizes: 4 row columns, one-row
        segments, slices, final rows, feed, page tables)."""
        t, f, s, _, cap1, capm = key
        w = min(self.width, max(cap1, capm) // 16)
        rows = t + MAX_SLICES + 1  # at most: every one-row entry and slice, the scratch row
        return w, rows, [t] * 4 + [4 * t, 4 * s, f, t, rows * w]

    def host_meta(self, batch: PackedBatch | None, key: Key,
                  feed: np.ndarray | None = None) -> np.ndarray:
        """The step's buffer, only as far as the table rows in use (the upload's length).
        ``feed``: per row, its input id's index among the previous step's ids (-1: its own)."""
        t, f, s, _, _, _ = key
        w, rows, sizes = self._sizes(key)
        fixed = sum(sizes[:-1])
        at = fixed - t  # the feed column: -1 (the row's own id) unless fed
        if batch is None:  # capture stand-in: every entry empty, all tables on the scratch
            out = np.zeros(fixed + rows * w, np.int32)
            out[2 * t : 3 * t] = self.scratch
            out[at:fixed] = -1
            out[fixed:] = self.scratch
            return out
        n, segs = batch.num_rows, batch.segments
        one = segs[:, 1] == 1
        single, multi = segs[one], segs[~one]
        d, m = single.shape[0], multi.shape[0]
        used = d + m + 1
        out = np.zeros(fixed + used * w, np.int32)
        slots = batch.slot_mapping()
        out[0:n] = batch.token_ids
        out[t : t + n] = batch.positions
        out[2 * t : 2 * t + n] = slots >> 4
        out[2 * t + n : 3 * t] = self.scratch  # padding rows: position 0 on the scratch page
        out[3 * t : 3 * t + n] = slots & 15
        sg = out[4 * t : 8 * t].reshape(t, 4)
        sg[:d, 0], sg[:d, 1], sg[:d, 2], sg[:d, 3] = single[:, 0], 1, single[:, 2], np.arange(d)
        pad = t - n
        sg[d : d + pad, 0], sg[d : d + pad, 1], sg[d : d + pad, 3] = np.arange(n, t), 1, d + m
        tiles = slice_tiles(multi, d)
        out[8 * t : 8 * t + tiles.size] = tiles.ravel()
        out[8 * t + 4 * s : 8 * t + 4 * s + batch.final_rows.shape[0]] = batch.final_rows
        out[at:fixed] = -1
        if feed is not None:
            out[at : at + n] = feed
        tables = out[fixed:].reshape(used, w)
        src = batch.page_tables[:, :w]
        tables[:d, : src.shape[1]] = src[single[:, 3]]
        tables[d : d + m, : src.shape[1]] = src[multi[:, 3]]
        tables[d + m] = self.scratch
        return out

    def _views(self, meta_dev: Any, key: Key) -> CupyMeta:
        t, f, s, chunk, cap1, capm = key
        w, rows, sizes = self._sizes(key)
        v = split(meta_dev, sizes)
        single, multi = v[4].reshape(t, 4), v[5].reshape(s, 4)
        return CupyMeta(t, v[0], v[1], v[2], v[3], single, v[8].reshape(rows, w), v[6], f,
                        chunk, max(cap1, capm), feed=v[7], fed=self.fed_in,
                        mixed=MixedSegments(single, multi, chunk, cap1, capm))

    def run(self, batch: PackedBatch, forward: Callable[[Any], Any],
            feed: np.ndarray | None = None, fed: Any = None) -> Any | None:
        """The step's logits [final rows, vocab] on the device (valid until the next step),
        or None when the step must run eagerly: a capture that ran out of device memory
        drops every mixed graph (their memory goes back to the device) and the step
        runs eagerly; later steps capture again, up to half as many graphs as were held.
        ``feed`` (a pipelined step) indexes ``fed``, the previous step's ids on the device."""
        import cupy as cp

        key = self.key(batch)

        def capture() -> Any:
            meta_dev = cp.asarray(self.host_meta(None, key))
            return capture_forward(forward, self.stream, meta_dev, self._views(meta_dev, key),
                                   self.memory, wait=False)

        cap = self._graph(key, capture)
        if cap is None:
            return None
        fill = None
        if feed is not None:  # on the graphs' stream, behind the sampler that wrote them
            fill = lambda: self.fed_in.data.copy_from_device_async(  # noqa: E731
                fed.data, min(fed.nbytes, self.fed_in.nbytes), self.stream)
        logits = cap.replay(self.stream, self.host_meta(batch, key, feed), self.ring, fill)
        self.num_replays += 1
        return logits[: batch.final_rows.shape[0]]
