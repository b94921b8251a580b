"""Per-stage time of the forward, summed over layers (``--profile``).

``ProfiledBackend(backend)`` stands in for a backend in ``llama.forward``; each backend call
is bracketed by two timestamps. On the GPU they are CUDA events, and a spin kernel queued
first holds the GPU while the host queues the whole forward, so the events time the
kernels back to back, not the host's launch overhead (which the graph path removes
anyway). On the numpy backend every call is synchronous and the wall clock does. It has no
``run_step``, so a ModelRunner using it runs eagerly. Stage names follow the forward:
embed, norm, qkv, rope_kv_store, attention, o (+residual), gate_up, swiglu, down (+residual),
final, and sampling (the device sampler's launch, or the host sampler's calls). Where the backend fuses a stage group into one kernel (small batches on the GPU),
the group is one stage: norm+qkv+rope_kv_store, norm+gate_up+swiglu.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from typing import Any

from crucible.model import llama

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""
_LINEAR_STAGE = {"qkv": "qkv", "o": "o", "gate_up": "gate_up", "down": "down",
                 "lm_head": "final"}


@functools.cache
def _spin_kernel() -> Any:
    import cupy as cp

    return cp.RawKernel(_SPIN, "spin")


class ProfiledBackend:
    run_step = None  # no fast path: the runner calls llama.forward, one timed op at a time
    fed_ids = None  # nor pipelined decode: every step's stages are timed in turn
    sampled_ids = None  # nor a decode graph's argmax: the sampler's launch is timed
    decode_stack = None  # nor the batch-1 stack, whose kernels span stages

    def __init__(self, backend: Any) -> None:
        self.be = backend
        self.gpu = backend.name != "numpy"
        self.marks: list[tuple[str, Any, Any]] = []
        self.totals: dict[str, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.be, name)

    def _timed(self, stage: str, fn: Any, *args: Any) -> Any:
        if not self.gpu:
            t0 = time.perf_counter()
            out = fn(*args)
            self.totals[stage] += (time.perf_counter() - t0) * 1000.0
            return out
        import cupy as cp

        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        out = fn(*args)
        end.record()
        self.marks.append((stage, start, end))
        return out

    def timed(self, stage: str, fn: Any, *args: Any) -> Any:
        """Time any call as ``stage`` (the engine times host sampling through this)."""
        return self._timed(stage, fn, *args)

    def prepare(self, batch: Any) -> Any:
        meta = self.be.prepare(batch)
        if self.gpu:
            import cupy as cp

            _spin_kernel()((1,), (1,), (cp.int64(40_000_000),))  # ~20 ms at ~2 GHz
        return meta

    def embed(self, meta: Any) -> Any:
        return self._timed("embed", self.be.embed, meta)

    def rmsnorm(self, x: Any, weight: str) -> Any:
        return self._timed("final" if weight == "final_norm" else "norm", self.be.rmsnorm, x,
                           weight)

    def linear(self, x: Any, weight: str) -> Any:
        return self._timed(_LINEAR_STAGE[weight.split(".")[-1]], self.be.linear, x, weight)

    def linear_add(self, x: Any, weight: str, residual: Any) -> Any:
        return self._timed(_LINEAR_STAGE[weight.split(".")[-1]], self.be.linear_add, x, weight,
                           residual)

    def rope_and_store(self, qkv: Any, layer: int, meta: Any) -> Any:
        return self._timed("rope_kv_store", self.be.rope_and_store, qkv, layer, meta)

    def attention(self, q: Any, layer: int, meta: Any) -> Any:
        return self._timed("attention", self.be.attention, q, layer, meta)

    def swiglu(self, gate_up: Any) -> Any:
        return self._timed("swiglu", self.be.swiglu, gate_up)

    # Fused stage groups: timed as one stage where the backend fuses them for this batch,
    # else composed here from the timed primitives (so prefill keeps its breakdown).
    def _fuses(self, x: Any, group: str) -> bool:
        fuses = getattr(self.be, "fuses", None)
        return fuses is not None and fuses(x, group)

    def attn_in(self, x: Any, layer: int, meta: Any) -> Any:
        if self._fuses(x, "attn_in"):
            return self._timed("norm+qkv+rope_kv_store", self.be.attn_in, x, layer, meta)
        return llama.compose_attn_in(self, x, layer, meta)

    def mlp_in(self, x: Any, layer: int) -> Any:
        if self._fuses(x, "mlp_in"):
            return self._timed("norm+gate_up+swiglu", self.be.mlp_in, x, layer)
        return llama.compose_mlp_in(self, x, layer)

    def norm_linear(self, x: Any, norm: str, weight: str) -> Any:
        if self._fuses(x, "norm_linear"):
            return self._timed("final", self.be.norm_linear, x, norm, weight)
        return self.linear(self.rmsnorm(x, norm), weight)

    def gather_rows(self, x: Any, meta: Any) -> Any:
        return self._timed("final", self.be.gather_rows, x, meta)

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage since the last call (synchronizes on the GPU)."""
        totals, self.totals = self.totals, defaultdict(float)
        if self.marks:
            import cupy as cp

            self.marks[-1][2].synchronize()
            for stage, start, end in self.marks:
                totals[stage] += cp.cuda.get_elapsed_time(start, end)
            self.marks.clear()
        return dict(totals)


class ProfiledSampler:
    """Times a device sampler's launches as the "sampling" stage of a ProfiledBackend."""

    sample_async = None  # the runner then calls sample(), which is timed

    def __init__(self, sampler: Any, profiled: ProfiledBackend) -> None:
        self.inner, self.pb = sampler, profiled

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self, logits: Any, rows: Any) -> Any:
        return self.pb.timed("sampling", self.inner.sample, logits, rows)
