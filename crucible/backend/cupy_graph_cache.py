"""The capture policy the singleton-prefill and mixed-step graphs share
(cupy_prefill_graphs.py, cupy_mixed_graphs.py): one graph per key, never evicted.

A key is captured on its ``capture_after``-th sighting while fewer than ``max_graphs`` are
held; until then, and once the cache is full, its steps run eagerly (counted). A capture
that runs out of device memory drops every graph of the cache (their memory goes back
to the device), its step runs eagerly, and from then on at most half as many graphs as were
held are captured: refilling the same set would run out again, each capture ~50 ms of the
step loop, and drop them all once more. Before that, a capture is not even tried while the
device lacks a step's headroom (``has_room``, backend/cupy_memory.py). The decode graphs
(cupy_graphs.py) keep their own policy: captured at start-up, evicted least recently used.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

from crucible.backend.cupy_capture import Captured
from crucible.backend.cupy_graph_memory import GraphMemory

MAX_SEEN = 4096  # keys whose sightings are counted (then the count starts over)


class GraphCache:
    """A subclass sets ``stream`` and calls ``_init_cache``; ``_graph`` does the rest."""

    stream: Any
    classes: Any = None  # kernels/capacity.py OwnedClasses (None: capacities as asked)

    def _init_cache(self, capture_after: int, max_graphs: int) -> None:
        self.graphs: dict[Hashable, Captured] = {}
        self.memory = GraphMemory()  # what the graphs share: one forward's working set
        self.seen: dict[Hashable, int] = {}  # sightings of keys without a graph
        self.num_captures = 0
        self.num_replays = 0
        self.num_eager = 0  # qualifying steps run eagerly (not seen enough, full, no memory)
        self.num_out_of_memory = 0  # captures abandoned for want of device memory
        self.capture_s = 0.0  # host time in captures (warm-up forward, capture, instantiate)
        # Per instance: the checks capture every key on sight (replay == eager is what they
        # test; when a key is captured changes no bits), and running out lowers the bound.
        self.capture_after, self.max_graphs = capture_after, max_graphs
        # Whether a capture may take device memory now (cupy_memory.MemoryGuard.has_room;
        # None: always). Without room the key is not captured and stays sighted.
        self.has_room: Callable[[], bool] | None = None

    def clear(self) -> None:
        """Drop every graph; their shared memory goes back to the device."""
        self.stream.synchronize()
        self.graphs.clear()
        self.seen.clear()
        self.memory.release()

    def drop_for_memory(self) -> int:
        """Drop every graph for want of device memory (their memory goes back to the device);
        from then on at most half as many are captured. Returns how many were dropped."""
        n = len(self.graphs)
        self.max_graphs = min(self.max_graphs, n // 2)
        self.clear()
        return n

    def is_new(self, key: Hashable) -> bool:
        """Whether a step of ``key`` would be captured or run eagerly for want of its graph
        (a first use: not when the cache is full, whose new keys run eagerly for good)."""
        return key not in self.graphs and len(self.graphs) < self.max_graphs

    def _graph(self, key: Hashable, capture: Callable[[], Captured]) -> Captured | None:
        """``key``'s graph, captured now by ``capture()`` if the policy says so; None when
        the step must run eagerly."""
        import cupy as cp

        cap = self.graphs.get(key)
        if cap is not None:
            return cap
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        seen = self.seen[key] = self.seen.get(key, 0) + 1
        if seen < self.capture_after or len(self.graphs) >= self.max_graphs:
            self.num_eager += 1
            return None
        if self.has_room is not None and not self.has_room():
            self.num_out_of_memory += 1
            self.num_eager += 1
            return None
        del self.seen[key]
        try:
            cap = capture()
        except cp.cuda.memory.OutOfMemoryError:
            self.drop_for_memory()
            self.num_out_of_memory += 1
            self.num_eager += 1
            return None
        self.graphs[key] = cap
        self.num_captures += 1
        self.capture_s += cap.seconds
        return cap
