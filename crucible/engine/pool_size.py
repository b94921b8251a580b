"""How many KV pages the pool gets: from the settings, the model and the device's memory.

One rule for every entry point:
- ``num_pages`` given: exactly that many;
- on the CPU otherwise: two full contexts (modest: host memory is shared with everything);
- on CUDA: ``kv_cache_memory`` bytes, or ``gpu_memory_fraction`` (default 0.9) of the device
  memory that is free once the weights are uploaded and the step scratch is set aside, but
  no more than ``max_running`` full contexts (pages beyond that would never be used).

The scratch reserve covers what a step allocates besides the pool: activations of a full
token budget, the logits of every running row, the captured graphs' memory (one working set
per graph kind: backend/cupy_graph_memory.py), and a fixed margin for the CUDA context and
kernels. It is an estimate on the safe side; a pool that leaves less than the reserve free
is refused with a message that says how much fits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from crucible.backend.protocol import Geometry
from crucible.engine.pages import pages_for
from crucible.engine.settings import DEFAULT_GPU_MEMORY_FRACTION, Settings
from crucible.errors import ConfigError
from crucible.step.batch import PAGE_SIZE

GiB = 1 << 30
MARGIN = 2 * GiB  # CUDA context, modules, allocator slack
GRAPH_COPIES = 4  # an eager step's working set and each graph kind's shared one
def page_bytes(geometry: Geometry) -> int:
    """K and V of one page across every layer, f32."""
    return 2 * geometry.n_layers * PAGE_SIZE * geometry.kv_dim * 4


def scratch_bytes(geometry: Geometry, settings: Settings) -> int:
    """What a step may allocate on the device besides the pool (an upper estimate)."""
    g = geometry
    activations = settings.token_budget * g.row_bytes * GRAPH_COPIES
    logits = 2 * settings.running_limit() * g.vocab_size * 4
    return MARGIN + activations + logits


@dataclass(frozen=True)
class PoolSize:
    num_pages: int
    how: str  # one line for the start-up report

    @property
    def summary(self) -> str:
        return f"KV pool: {self.num_pages:,} pages ({self.how})"


def pool_size(settings: Settings, geometry: Geometry, device: str,
              memory: tuple[int, int] | None) -> PoolSize:
    """``memory``: (free, total) device bytes after the weights are uploaded (CUDA), or
    None (CPU)."""
    per_page = page_bytes(geometry)

    def report(pages: int, source: str) -> PoolSize:
        gib = pages * per_page / GiB
        return PoolSize(pages, f"{pages * PAGE_SIZE:,} positions, {gib:.2f} GiB: {source}")

    if settings.num_pages is not None:
        return fits(report(settings.num_pages, "num_pages"), per_page, memory)
    if device != "cuda" or memory is None:
        if settings.kv_cache_memory is not None or settings.gpu_memory_fraction is not None:
            raise ConfigError("kv_cache_memory and gpu_memory_fraction size a CUDA pool; "
                              "on the CPU give num_pages")
        return fits(report(2 * pages_for(geometry.max_context),
                           "two full contexts (CPU default)"), per_page, None)
    free, total = memory
    room = free - scratch_bytes(geometry, settings)
    if settings.kv_cache_memory is not None:
        want = settings.kv_cache_memory
        if want > room:
            raise ConfigError(f"kv_cache_memory of {want / GiB:.2f} GiB does not fit: "
                              f"{max(room, 0) / GiB:.2f} GiB are free after the weights and "
                              f"the step scratch ({total / GiB:.1f} GiB device)")
        source = f"kv_cache_memory {want / GiB:.2f} GiB"
    else:
        fraction = settings.gpu_memory_fraction or DEFAULT_GPU_MEMORY_FRACTION
        want = int(fraction * room)
        source = (f"{fraction:g} of the {max(room, 0) / GiB:.1f} GiB free after weights and "
                  f"scratch")
    pages = want // per_page
    if settings.kv_cache_memory is None:
        # More pages than every admitted request can hold at full context are never used.
        cap = settings.running_limit() * pages_for(geometry.max_context)
        if pages > cap:
            pages, source = cap, f"{source}, capped at max_running full contexts"
    if pages < pages_for(geometry.max_context):
        raise ConfigError(f"the KV pool would hold {pages} pages, less than one full context "
                          f"({pages_for(geometry.max_context)} pages); free device memory or "
                          f"give num_pages")
    return report(pages, source)


def host_memory() -> int | None:
    """This host's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def fits(size: PoolSize, per_page: int, memory: tuple[int, int] | None) -> PoolSize:
    """``size`` if its K/V arrays can exist at all: no more than the device's free memory
    (CUDA: ``memory``), or the host's physical memory (CPU). A larger pool would fail as a
    bare MemoryError in the backend's allocation, or be killed once its pages are touched."""
    need = size.num_pages * per_page
    room, where = (memory[0], "free on the device") if memory is not None else \
        (host_memory(), "of memory on this host")
    if room is not None and need > room:
        raise ConfigError(f"the KV pool of {size.num_pages:,} pages needs {need / GiB:,.2f} "
                          f"GiB, more than the {room / GiB:,.2f} GiB {where} "
                          f"({size.how.split(': ', 1)[-1]}); give a smaller num_pages")
    return size
