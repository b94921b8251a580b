"""Device memory the captured graphs may take, and what a step always finds free.

The KV pool is sized first (engine/pool_size.py: a fraction of the memory free after the
weights and a step's scratch), and the graphs take what is left as they are captured.
Each graph cache's graphs share one forward's working set and one logits buffer
(cupy_graph_memory.py), so the three caches hold a few hundred MB on the default model
however many graphs they keep. (When each graph kept a private pool they held the sum:
on an H100 with a 73 GB KV pool the chat mix's graphs grew past what the pool left, and
every step failed for minutes, bench/serve-sweep-chat-oom-h100.log and, with this guard
but still private pools, bench/serve-sweep-chat-oom-guard-h100.log.)

Still, the device can run short (a larger model, a pool given by hand), so a capture is
made only while ``headroom`` bytes stay free, enough for the largest eager step
(activations and logits of ``EAGER_ROWS`` rows) plus a margin for attention's scratch and
the allocator. Free means free on the device once CuPy's default pool gave back the blocks
it holds unused. Below it:
- a prefill or mixed key is not captured: its step runs eagerly (counted as a capture
  given up for want of memory) and a later sighting tries again, after ``RECHECK_S``;
- the decode graphs, which a pipelined step cannot do without, first make room: the
  prefill and mixed graphs are dropped (their memory goes back to the device; each cache
  then captures at most half as many as it held, as after an out-of-memory capture),
  then the decode graphs themselves (they share their memory, so one pair alone frees
  nothing).
A step that still runs out of memory runs once more after the prefill and mixed graphs
and the default pool's cached blocks went back to the device, and a third time after the
decode graphs went too (cupy_route.run_step); the exact kernels write the same K/V bits
again, so a retry changes nothing a request sees.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

log = logging.getLogger("crucible.memory")
MARGIN = 1 << 30  # attention's per-step scratch, the allocator's rounding, the context
EAGER_ROWS = 2048  # the largest token budget a step runs eagerly with (LLM's default)
# After a check that found no room, later checks answer no for this long without looking:
# a short device would otherwise hand the default pool's blocks back at every eager step
# that sights a key, and that step's allocations would come from the device again.
RECHECK_S = 1.0


def step_headroom(cfg: Any, mixed_graph_rows: int) -> int:
    """Bytes an eager step of the largest size may allocate (an upper estimate): every
    intermediate of each row, twice over (one layer's outputs while the next is made), and
    the logits of every row with the sampler's copy."""
    rows = max(EAGER_ROWS, mixed_graph_rows)
    return MARGIN + 2 * rows * cfg.row_bytes + 2 * rows * cfg.vocab_size * 4


def free_bytes(need: int) -> int:
    """The device's free memory; when that is under ``need``, counted again once the
    default pool's unused cached blocks went back to the device (the graphs' pools
    allocate from the device and cannot use them)."""
    import cupy as cp

    free = int(cp.cuda.runtime.memGetInfo()[0])
    pool = cp.get_default_memory_pool()
    if free < need and pool.free_bytes():
        pool.free_all_blocks()
        free = int(cp.cuda.runtime.memGetInfo()[0])
    return free


class MemoryGuard:
    """``has_room``: whether a capture may take memory now; ``make_room``: drop graphs
    (prefill and mixed first, then the decode graphs) until it may."""

    def __init__(self, be: Any, headroom: int, free: Callable[[int], int] = free_bytes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.be, self.headroom, self.free, self.clock = be, headroom, free, clock
        self._short_until = float("-inf")  # no room was found; not looked at again till then
        self.num_dropped = 0  # graphs dropped to make room
        self.num_retries = 0  # steps run again after running out of memory

    @classmethod
    def wire(cls, be: Any, headroom: int) -> "MemoryGuard":
        """The guard of ``be``'s graph caches, hooked into each of them."""
        guard = cls(be, headroom)
        for cache in (be.prefill_graphs, be.mixed_graphs):
            if cache is not None:
                cache.has_room = guard.has_room
        if be.graphs is not None:
            be.graphs.make_room = guard.make_room
        return guard

    @staticmethod
    def out_of_memory(exc: BaseException) -> bool:
        import cupy as cp

        return isinstance(exc, cp.cuda.memory.OutOfMemoryError)

    def has_room(self) -> bool:
        now = self.clock()
        if now < self._short_until:
            return False
        if self.free(self.headroom) >= self.headroom:
            return True
        self._short_until = now + RECHECK_S
        return False

    def _room_now(self) -> bool:
        """has_room without the pause: after graphs were dropped, memory came back."""
        self._short_until = float("-inf")
        return self.has_room()

    def release(self, decode: bool = False) -> None:
        """Drop every prefill and mixed graph (each cache then holds at most half as many
        as it did), with ``decode`` the decode graphs too, and return the default pool's
        cached blocks to the device."""
        import cupy as cp

        dropped = sum(cache.drop_for_memory() for cache in
                      (self.be.prefill_graphs, self.be.mixed_graphs)
                      if cache is not None and cache.graphs)
        graphs = self.be.graphs
        if decode and graphs is not None and graphs.graphs:
            dropped += 2 * len(graphs.graphs)
            graphs.clear()  # waits for the device: a pair may still be replaying
        cp.get_default_memory_pool().free_all_blocks()
        if dropped:  # rare, and what an operator sizing the pool wants to know
            self.num_dropped += dropped
            log.warning("device memory is short: %d graphs dropped (prefill and mixed "
                        "caches now keep at most half as many); a smaller KV pool leaves "
                        "them room", dropped)

    def make_room(self) -> bool:
        """For a decode capture: True once ``headroom`` is free (always, when it already
        was); the other graphs go first, then the decode graphs."""
        if self._room_now():
            return True
        self.release()
        if self._room_now():
            return True
        self.release(decode=True)
        return self._room_now()
