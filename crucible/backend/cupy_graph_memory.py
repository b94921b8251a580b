"""The device memory one graph cache's graphs share: a pool for their intermediates and one
logits buffer.

A captured graph bakes in the address of every array its forward touches. Each graph once
kept a private pool of its own, so a cache held the sum of its graphs' working sets: 64
decode graphs of up to 512 rows each kept their own logits (100 MB at 512 rows), and on an
H100 whose KV pool had taken 90% of the memory the chat mix's graphs grew past what was
left until no eager step could allocate (bench/serve-sweep-chat-oom-guard-h100.log).

Sharing is safe because a cache's replays never overlap: every replay is ordered behind
the default stream and the default stream behind it (cupy_capture.py), and a step's logits
are consumed (sampler, argmax, the rows copied to the host) by work queued on the default
stream before the next step is queued. So within a cache:
- intermediates: every capture allocates from the cache's one pool, and blocks that one
  capture freed are handed to the next: a graph's intermediates are dead once its replay
  ends, whatever another graph later writes there. The pool never returns a block to the
  device while a graph that may use it lives: only ``release`` frees it, after every graph
  of the cache was dropped and the device went idle;
- logits: the LM head writes into one buffer of the cache (``logits_out``), grown by
  doubling when a capture needs more rows; a grown-out buffer lives on as long as the
  graphs that write it (their ``Captured.logits`` views hold it).

A cache then holds about one forward's working set plus one logits buffer, whatever the
number of graphs. The pool is per cache, not per backend, because CuPy hands a freed
block only to allocations on the stream that freed it, and each cache captures on its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

MIN_ROWS = 64  # the first logits buffer's rows (12 MB at a 49,152 vocabulary)

_CAPTURING: ContextVar["GraphMemory | None"] = ContextVar("capturing", default=None)


class GraphMemory:
    def __init__(self) -> None:
        self.pool: Any = None  # cupy.cuda.MemoryPool, made on the first capture
        self._logits: Any = None  # [rows, vocab] f32 from the default pool
        self.nbytes = 0  # device bytes held (the pool's blocks, the logits buffer): measure

    def take_pool(self) -> Any:
        import cupy as cp

        if self.pool is None:
            self.pool = cp.cuda.MemoryPool()
        return self.pool

    def logits(self, rows: int, vocab: int) -> Any:
        """A [rows, vocab] view of the shared logits buffer, grown first where it is too
        small. It comes from the default pool, not the graphs' pool: the engine may still
        hold the last step's logits when ``release`` frees the graphs' pool."""
        import cupy as cp

        buf = self._logits
        if buf is None or buf.shape[0] < rows or buf.shape[1] != vocab:
            n = MIN_ROWS if buf is None or buf.shape[1] != vocab else 2 * buf.shape[0]
            while n < rows:
                n *= 2
            mem = cp.get_default_memory_pool().malloc(n * vocab * 4)
            buf = self._logits = cp.ndarray((n, vocab), cp.float32, memptr=mem)
        return buf[:rows]

    def measure(self) -> None:
        """Refresh ``nbytes`` after a capture, the only time this memory grows: the engine
        reports it with every step (graph_stats), so it is read there, not recounted."""
        held = 0 if self.pool is None else int(self.pool.total_bytes())
        self.nbytes = held + (0 if self._logits is None else int(self._logits.nbytes))

    def release(self) -> None:
        """Give the memory back to the device. Only once the cache dropped every graph: the
        device is synchronized first, since a replay may still be running."""
        import cupy as cp

        if self.pool is None and self._logits is None:
            return
        cp.cuda.Device().synchronize()
        if self.pool is not None:
            self.pool.free_all_blocks()
        self.pool, self._logits, self.nbytes = None, None, 0

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """While a forward runs for a capture (its warm-up too), the LM head writes into this
        cache's logits buffer (``logits_out``)."""
        token = _CAPTURING.set(self)
        try:
            yield
        finally:
            _CAPTURING.reset(token)


def logits_out(rows: int, vocab: int) -> Any | None:
    """Where the LM head writes its [rows, vocab] logits: the capturing cache's shared buffer,
    or None outside a capture (the backend allocates them)."""
    memory = _CAPTURING.get()
    return None if memory is None else memory.logits(rows, vocab)
