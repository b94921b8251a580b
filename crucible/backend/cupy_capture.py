"""A forward captured as a CUDA graph, and its replays: the one capture and replay shared by
the decode, singleton-prefill and mixed-step graphs (cupy_graphs.py, cupy_prefill_graphs.py,
cupy_mixed_graphs.py), which differ in what they key, pad and feed.

A capture runs the forward once eagerly (kernels compile, the cache's memory pool grows to
its working set), then again under stream capture; the graph keeps its metadata buffer and
the memory its cache's graphs share (cupy_graph_memory.py: one pool for intermediates, one
logits buffer) for as long as it lives, so a replay only refills the metadata.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from crucible.backend.cupy_graph_memory import GraphMemory


@dataclass
class Captured:
    graph: Any
    meta_dev: Any  # int32 buffer the metadata views point into
    logits: Any  # [R, vocab] device buffer written by the graph
    pool: Any  # its cache's memory pool: every intermediate it touches lives there
    done: Any = None  # event: this graph's last replay finished (its metadata may change)
    seconds: float = 0.0  # host time the capture took (warm-up, capture, instantiation)

    def replay(self, stream: Any, host_meta: np.ndarray, ring: Any,
               fill: Callable[[], None] | None = None) -> Any:
        """Refill the metadata (through page-locked staging: nothing here waits for the
        device), replay on ``stream``, and return the logits buffer. (The prefill and mixed
        graphs' form: their own stream, between two hops through the default one.)
        ``fill``: more to queue on ``stream`` before the graph (a fed step's ids)."""
        import cupy as cp

        # Work queued eagerly on the default stream (a prefill's K/V, the previous step's
        # sampler and its ids) must land first.
        stream.wait_event(cp.cuda.Stream.null.record())
        if fill is not None:
            fill()
        ring.upload(host_meta, self.meta_dev, stream)
        self.graph.launch(stream=stream)
        # Later work on the default stream (the next eager step) comes after the graph.
        cp.cuda.Stream.null.wait_event(stream.record())
        return self.logits

    def replay_default(self, host_meta: np.ndarray, ring: Any, upload: Any,
                       after: Any = None) -> Any:
        """The decode form: the metadata goes up on ``upload`` once this graph's previous
        replay has read it (a twin's: not the step still running), and the graph replays on
        the default stream, behind everything queued there, once the upload and ``after``
        (an event, or None) are done."""
        import cupy as cp

        null = cp.cuda.Stream.null
        # An event already reached (the usual case: the host has read that step's ids) needs
        # no wait queued; the device-side wait would still cost the stream a step.
        if self.done is not None and not self.done.done:
            upload.wait_event(self.done)
        ring.upload(host_meta, self.meta_dev, upload)
        null.wait_event(upload.record())
        if after is not None and not after.done:
            null.wait_event(after)
        self.graph.launch(stream=null)
        self.done = null.record()
        return self.logits


def capture_forward(forward: Callable[[Any], Any], stream: Any, meta_dev: Any, meta: Any,
                    memory: GraphMemory, tail: Callable[[Any, bool], None] | None = None,
                    wait: bool = True) -> Captured:
    """Capture ``forward(meta)`` (``meta``: views into ``meta_dev``) as a CUDA graph, then
    ``tail(logits, warm_up)`` (the decode graphs' argmax) when given.

    Every array the forward allocates comes from ``memory``'s pool, which the cache's other
    graphs share and which nothing outside them is ever handed; its logits go into
    ``memory``'s logits buffer (cupy_graph_memory.py says why sharing is safe).

    The warm-up runs on ``stream`` after everything queued on the default stream: that is
    where ``meta_dev`` was filled, and, with pipelined decode, where the previous step may
    still be running. (Without this wait the warm-up once read a metadata buffer whose copy
    had not landed yet and faulted on its garbage page indices.) Its ``tail`` must write
    nowhere a step in flight reads: the decode graphs give it a scratch target.

    ``wait``: the host waits for the warm-up (and so for the step queued before it) before
    capturing, so that a replay on another stream cannot overtake it: the decode graphs
    replay on the default stream. The prefill and mixed graphs replay on ``stream`` itself,
    behind the warm-up, and pass False: the capture records and launches nothing, so it may
    start while the warm-up runs, and the host saves that wait (part of a capture's
    ~50 ms)."""
    import cupy as cp

    t0 = time.perf_counter()
    pool = memory.take_pool()
    stream.wait_event(cp.cuda.Stream.null.record())
    with cp.cuda.using_allocator(pool.malloc), stream, memory.capturing():
        logits = forward(meta)  # warm-up: compiles, and sizes the pool
        if tail is not None:
            tail(logits, True)
        if wait:
            stream.synchronize()
        stream.begin_capture()
        try:
            logits = forward(meta)
            if tail is not None:
                tail(logits, False)
        finally:
            graph = stream.end_capture()
    memory.measure()
    return Captured(graph, meta_dev, logits, pool, seconds=time.perf_counter() - t0)
