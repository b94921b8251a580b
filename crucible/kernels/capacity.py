"""Score-capacity classes for graph keys: the largest capacity an attention launch can take
without losing a CTA per SM.

A CUDA graph bakes in its attention launches' score capacity C (the shared score buffer's
floats per distribution), so a graph key rounds the step's capacity up to a class; coarse
classes mean few captures. The capacity changes no bit (each row's loops run to its own
length; only the buffer's stride and size grow), but it sizes a CTA's dynamic shared memory
and with it how many CTAs an SM holds. Powers of two cost the default model's exact tiled
kernel half its CTAs in a common chat case: slices ending past 1,024 positions got C = 2,048
(119 KB a CTA: one an SM) where C = 1,792 still fits two, and decode rows past 2,048 got
4,096 (two CTAs an SM where 3,328 keeps three).

So a class here is the largest multiple of 256 (at most a ceiling, the context's capacity)
whose launch runs the same kernel with the same CTAs an SM as the capacity asked for:
as coarse as it can be at no cost to the device. How many CTAs fit is the driver's answer
(cuOccupancyMaxActiveBlocksPerMultiprocessor), which counts registers, threads and shared
memory; host-only tests pass an occupancy function of their own.

Measured on an H100 (bench/capacity-classes-occupancy-h100.json, replays of 1,024-row mixed
graphs against powers of two, same bits): a chat cohort's step 1.47-1.50x faster, a step of
256 running requests 1.13x, but a lone joiner's step beside 63 decodes 0.93x. Which of
its two launches lost is not known. Its slice grid is 63 live CTAs, under one wave at any
occupancy; a guess was that the block scheduler packs such a grid onto fewer SMs when more
fit each. The ``spread`` rule (off: ``SPREAD``) tested it: a grid that fits one wave takes
the widest class holding just the CTAs an SM that wave needs, so it must spread; with it
on, the decode graphs past the batch-1 stack and the lone-prefill graphs take classes too.
Measured (H100, bench/capacity-classes-prefetch-h100.json): 1.00x on the mixed graphs,
0.96-0.97x on the decode graphs at 64 and 128 rows, so it stays off. What won the joiner
back is attn_exact's prefetching instance (variants.PREFETCH, docs/attention.md).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from crucible.kernels import variants
from crucible.kernels.variants import LaunchPlan, Variant, plan_launch, score_capacity

STEP = 256  # score_capacity's granule: the classes' step
SPREAD = False  # the spread rule's default: measured, no gain (above)

Occupancy = Callable[[LaunchPlan], int]  # CTAs an SM for one launch plan


@dataclass(frozen=True)
class CapacityClasses:
    """The classes of one model geometry and attention variant on one device."""

    n_heads: int
    n_kv_heads: int
    variant: Variant
    ceiling: int  # the context's score capacity: no class goes past it
    smem_limit: int  # the device's opt-in shared memory per CTA
    sm_count: int
    occupancy: Occupancy
    spread: bool = SPREAD  # one-wave grids: as few CTAs an SM as hold the grid (above)
    # attn_exact's prefetching instance, as plan_launch picks it (variants.PREFETCH when
    # made): a field, so classes made under one setting never answer for the other
    prefetch: bool = field(default_factory=lambda: variants.PREFETCH)

    def _plan(self, capacity: int, decode: bool, rows: int) -> LaunchPlan | None:
        try:
            return plan_launch(self.variant, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                               head_dim=64, capacity=capacity, smem_limit=self.smem_limit,
                               decode=decode, rows=rows, sm_count=self.sm_count,
                               prefetch=self.prefetch)
        except ValueError:  # past every kernel's shared memory
            return None

    def _widest(self, capacity: int, decode: bool, rows: int, grid: Callable[[LaunchPlan], int]
                ) -> int:
        capacity = score_capacity(max(1, capacity))
        first = self._plan(capacity, decode, rows)
        if first is None:
            return capacity
        # A grid of one wave needs only ceil(grid / SMs) CTAs an SM (the spread rule).
        ctas = self.occupancy(first)
        if self.spread:
            ctas = min(ctas, max(1, -(-grid(first) // self.sm_count)))
        c = capacity
        while c + STEP <= self.ceiling:
            nxt = self._plan(c + STEP, decode, rows)
            if nxt is None or _kernel(nxt) != _kernel(first) or self.occupancy(nxt) < ctas:
                break
            c += STEP
        return c

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (a few dozen keys per engine)
    def decode(self, capacity: int, rows: int) -> int:
        """The class of a launch of ``rows`` one-row segments (attn_decode)."""
        return self._widest(capacity, True, rows,
                            lambda p: self.n_heads // p.decode_heads * rows)

    @functools.lru_cache(maxsize=1024)  # noqa: B019
    def slices(self, capacity: int, chunk: int = 1 << 20, slices: int = 1) -> int:
        """The class of a launch of ``slices`` prefill slices over a grid of ``chunk`` rows
        each (the tiled kernel)."""
        return self._widest(capacity, False, 0,
                            lambda p: self.n_kv_heads * -(-chunk // p.variant.rows) * slices)


def _kernel(plan: LaunchPlan) -> tuple:
    """What makes two plans the same kernel at the same CTA size (shared memory aside)."""
    return plan.variant, plan.decode, plan.decode_heads, plan.threads, plan.prefetch


def device_occupancy(plan: LaunchPlan) -> int:
    """CTAs an SM the driver fits for ``plan``'s kernel, threads and shared memory."""
    from crucible.kernels.loader import attention_kernel, decode_kernel, ensure_dynamic_smem

    current_context()
    kernel = (decode_kernel(plan.decode_heads) if plan.decode
              else attention_kernel(plan.variant, plan.prefetch))
    ensure_dynamic_smem(kernel, plan.smem_bytes)  # a launch past 48 KiB needs the opt-in
    return _occupancy(getattr(kernel, "kernel", kernel), plan.threads, plan.smem_bytes)


def current_context() -> None:
    """Make the device's primary context (CuPy's) current on this thread. A driver call
    needs a current context, and a thread that has not yet touched the runtime has none:
    an AsyncLLMEngine's step thread failed here with CUresult 201 (invalid context) when
    its first mixed graph key was the first occupancy query. cudaSetDevice sets it."""
    import cupy as cp

    cp.cuda.runtime.setDevice(cp.cuda.runtime.getDevice())


def _occupancy(func: Any, threads: int, smem: int) -> int:
    kernel_ptr = int(func.ptr)  # the loaded CUfunction (compiles the module on first use)
    n = ctypes.c_int(0)
    rc = _driver_occupancy()(ctypes.byref(n), ctypes.c_void_p(kernel_ptr),
                             ctypes.c_int(threads), ctypes.c_size_t(smem))
    if rc != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: CUresult {rc}")
    return int(n.value)


@functools.cache
def _driver_occupancy() -> Any:
    fn = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def device_classes(n_heads: int, n_kv_heads: int, variant: Variant,
                   ceiling: int) -> CapacityClasses:
    from crucible.kernels.loader import sm_count, smem_optin_limit

    return CapacityClasses(n_heads, n_kv_heads, variant, ceiling, smem_optin_limit(),
                           sm_count(), device_occupancy)


class OwnedClasses:
    """A graph cache's classes: its owner's (the backend's ``cfg`` and ``variant``), made on
    first use and remade when the geometry or variant is no longer theirs. ``classes`` may
    be set directly (host-only tests, benchmarks comparing rules)."""

    def __init__(self, owner: Any, table_width: int) -> None:
        # no class past the context's capacity (its page table's ``table_width`` pages)
        self.owner, self.ceiling = owner, score_capacity(table_width * 16)
        self.classes: CapacityClasses | None = None

    def get(self) -> CapacityClasses:
        c, cfg = self.classes, self.owner.cfg
        if c is None or (c.n_heads, c.n_kv_heads, c.variant, c.prefetch) != \
                (cfg.n_heads, cfg.n_kv_heads, self.owner.variant, variants.PREFETCH):
            c = self.classes = device_classes(cfg.n_heads, cfg.n_kv_heads, self.owner.variant,
                                              self.ceiling)
        return c
