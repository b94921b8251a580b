"""Page-locked staging for the step's small host<->device copies, so none of them blocks.

A copy from pageable host memory may wait for the device (CuPy's plain ``asarray`` is a
synchronous ``cudaMemcpy``: it waits for all queued work), which would stall a pipelined
decode loop exactly where it should run ahead. Every per-step copy therefore goes through a
ring of page-locked buffers and is queued on a stream like a kernel.

Each kind of copy (a step's metadata, its ids, its logprob words) has its own ring, so a
step makes at most one copy per ring and a slot is reused ``SLOTS`` steps later. The engine
keeps at most two steps in flight and waits for the older one before it queues a third, so
by the time a slot comes round again its copy has finished and the host has read it. (A
shared ring once let the next step's logprob words land in a slot whose ids the host had
not read yet.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

SLOTS = 4


class PinnedRing:
    def __init__(self, slots: int = SLOTS) -> None:
        self._bufs: list[np.ndarray | None] = [None] * slots
        self._next = 0

    def slot(self, nbytes: int) -> np.ndarray:
        """The next ring buffer as uint8 [>= nbytes] (grown when too small)."""
        import cupyx

        i = self._next
        self._next = (i + 1) % len(self._bufs)
        buf = self._bufs[i]
        if buf is None or buf.nbytes < nbytes:
            buf = cupyx.empty_pinned(max(nbytes, 4096), dtype=np.uint8)
            self._bufs[i] = buf
        return buf

    def upload(self, host: np.ndarray, dev: Any, stream: Any) -> None:
        """Queue host -> dev (same dtype and size) on ``stream``; ``host`` may change after."""
        host = np.ascontiguousarray(host)
        if host.dtype != dev.dtype or host.size > dev.size:
            raise ValueError(f"upload of {host.dtype} x {host.size} into {dev.dtype} x {dev.size}")
        stage = self.slot(host.nbytes)[: host.nbytes].view(host.dtype)
        np.copyto(stage, host.ravel())
        dev.data.copy_from_host_async(stage.ctypes.data, host.nbytes, stream)

    def download(self, dev: Any, stream: Any) -> np.ndarray:
        """Queue dev -> a pinned host view on ``stream``; read it after the stream's event."""
        stage = self.slot(dev.nbytes)[: dev.nbytes].view(dev.dtype).reshape(dev.shape)
        dev.data.copy_to_host_async(stage.ctypes.data, dev.nbytes, stream)
        return stage


def device_buffer(have: Any, n: int, dtype: Any) -> Any:
    """``have`` if it holds at least ``n`` items, else a new device array of ``n``."""
    import cupy as cp

    if have is not None and have.size >= n:
        return have
    return cp.empty(max(n, 1), dtype=dtype)
