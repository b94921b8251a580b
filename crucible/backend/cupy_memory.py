"""Device memory the captured graphs may take, and what a step always finds free.

The KV pool is sized first (engine/pool_size.py: a fraction of the memory free after the
weights and a step's scratch), and the graphs take what is left as they are captured:
each keeps a private pool of one forward's working set for as long as it lives, up to
~400 MB for a 1,024-row mixed step (its logits alone are 200 MB). Sixty-four decode
graphs, 64 prefill and 32 mixed ones can hold far more than the pool leaves, and without
a bound they did: on an H100 with a 73 GB pool, the chat mix's growing histories kept
adding graph keys until eager steps could not allocate their logits, and every step
failed, for minutes (bench/serve-sweep-chat-oom-h100.log).

So a capture is made only while ``headroom`` bytes stay free, enough for the largest
eager step (activations and logits of ``EAGER_ROWS`` rows) plus a margin for attention's
scratch and the allocator. Free means free on the device once CuPy's default pool gave
back the blocks it holds unused. Below it:
- a prefill or mixed key is not captured: its step runs eagerly (counted as a capture
  given up for want of memory) and a later sighting tries again, after ``RECHECK_S``;
- the decode graphs, which a pipelined step cannot do without, first make room: the
  prefill and mixed graphs are dropped (their pools go back to the device; each cache
  then captures at most half as many as it held, as after an out-of-memory capture),
  then the least recently used decode pairs.
And a step that still runs out of memory drops the prefill and mixed graphs, returns the
default pool's cached blocks and runs once more (cupy_route.run_step); the exact kernels
write the same K/V bits again, so the retry changes nothing a request sees.
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
    default pool's unused cached blocks went back to the device (a graph's private pool
    allocates from the device and cannot use them)."""
    import cupy as cp

    free = int(cp.cuda.runtime.memGetInfo()[0])
    pool = cp.get_default_memory_pool()
    if free < need and pool.free_bytes():
        pool.free_all_blocks()
        free = int(cp.cuda.runtime.memGetInfo()[0])
    return free


class MemoryGuard:
    """``has_room``: whether a capture may take memory now; ``make_room``: drop graphs
    (prefill and mixed first, then the oldest decode pairs) until it may."""

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

    def release(self) -> None:
        """Drop every prefill and mixed graph (each cache then holds at most half as many
        as it did) and return the default pool's cached blocks to the device."""
        import cupy as cp

        dropped = sum(cache.drop_for_memory() for cache in
                      (self.be.prefill_graphs, self.be.mixed_graphs)
                      if cache is not None and cache.graphs)
        cp.get_default_memory_pool().free_all_blocks()
        if dropped:  # rare, and what an operator sizing the pool wants to know
            self.num_dropped += dropped
            log.warning("device memory is short: %d prefill/mixed graphs dropped (each kind "
                        "now keeps at most half as many); a smaller KV pool leaves them room",
                        dropped)

    def make_room(self) -> bool:
        """For a decode capture: True once ``headroom`` is free (always, when it already
        was); the other graphs go first, then the decode pairs, oldest first."""
        if self._room_now():
            return True
        self.release()
        room = self._room_now()
        decode = self.be.graphs
        if room or decode is None or not decode.graphs:
            return room
        import cupy as cp

        # Decode pairs replay on the default stream, maybe the previous step's still: a
        # pair's pool must outlive its replays.
        cp.cuda.Device().synchronize()
        while decode.graphs:
            decode.graphs.popitem(last=False)
            self.num_dropped += 2
            if self._room_now():
                return True
        return False
