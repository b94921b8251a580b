"""Per-stage time of the forward, summed over layers (``--profile``).

``ProfiledBackend(backend)`` stands in for a backend under the runner; each backend call
is bracketed by two timestamps. On the GPU they are CUDA events, and a spin kernel queued
first holds the GPU while the host queues the whole forward, so the events time the
kernels back to back, not the host's launch overhead (which the graph path removes
anyway). On the numpy backend every call is synchronous and the wall clock does. Its
``run_step`` always runs the forward eagerly, one timed operation at a time: no graphs, no
pipelined decode, no decode stack (whose kernels span stages). Stage names follow the forward:
embed, norm, qkv, rope_kv_store, attention, o (+residual), gate_up, swiglu, down (+residual),
final, and sampling (the device sampler's launch, or the host sampler's calls). Where the backend fuses a stage group into one kernel (small batches on the GPU),
the group is one stage: norm+qkv+rope_kv_store, norm+gate_up+swiglu.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from typing import Any

from crucible.backend import stages
from crucible.backend.protocol import Backend, BackendWeights, Forward, Geometry
from crucible.step.rows import ReadySample

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
    def __init__(self, backend: Backend) -> None:
        self.be = backend
        self.name, self.device = backend.name, backend.device
        self.gpu = backend.device == "cuda"
        self.marks: list[tuple[str, Any, Any]] = []
        self.totals: dict[str, float] = defaultdict(float)

    @property
    def arithmetic(self) -> str:
        return self.be.arithmetic

    def load_weights(self, geometry: Geometry, weights: BackendWeights) -> None:
        self.be.load_weights(geometry, weights)

    def allocate_pool(self, num_pages: int) -> None:
        self.be.allocate_pool(num_pages)

    def memory_info(self) -> tuple[int, int] | None:
        return self.be.memory_info()

    def device_sampler(self) -> Any:
        return self.be.device_sampler()

    def capture_graphs(self, forward: Forward, max_rows: int) -> int:
        return 0  # profiled steps run eagerly, stage by stage

    def run_step(self, batch: Any, forward: Forward, feed: Any = None) -> Any:
        if feed is not None:
            raise ValueError("a profiled backend runs no fed (pipelined) steps")
        return forward(self.prepare(batch))

    def first_use(self, batch: Any, fed: bool) -> bool:
        return False  # profiled steps run eagerly, stage by stage

    def fed_ids(self, rows: int) -> None:
        return None  # every step's stages are timed in turn: no pipelining

    def mixed_feed_rows(self) -> None:
        return None

    def sampled_ids(self, rows: int) -> None:
        return None  # no graph ran an argmax: the sampler's launch is timed

    def ids_copied(self, event: Any) -> None:
        pass

    def decode_stack(self, meta: Any) -> None:
        return None

    def to_host(self, x: Any) -> Any:
        return self.be.to_host(x)

    def fuses(self, x: Any, group: str) -> bool:
        return self.be.fuses(x, group)

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
        return self.be.fuses(x, group)

    def attn_in(self, x: Any, layer: int, meta: Any) -> Any:
        if self._fuses(x, "attn_in"):
            return self._timed("norm+qkv+rope_kv_store", self.be.attn_in, x, layer, meta)
        return stages.attn_in(self, x, layer, meta)

    def mlp_in(self, x: Any, layer: int) -> Any:
        if self._fuses(x, "mlp_in"):
            return self._timed("norm+gate_up+swiglu", self.be.mlp_in, x, layer)
        return stages.mlp_in(self, x, layer)

    def norm_linear(self, x: Any, norm: str, weight: str) -> Any:
        if self._fuses(x, "norm_linear"):
            return self._timed("final", self.be.norm_linear, x, norm, weight)
        return stages.norm_linear(self, x, norm, weight)

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
    """Times a device sampler's launches as the "sampling" stage of a ProfiledBackend; each
    call waits for its ids, so the stage covers the kernel."""

    def __init__(self, sampler: Any, profiled: ProfiledBackend) -> None:
        self.inner, self.pb = sampler, profiled

    def sample(self, logits: Any, rows: Any) -> Any:
        return self.pb.timed("sampling", self.inner.sample, logits, rows)

    def sample_async(self, logits: Any, rows: Any, tokens_out: Any = None,
                     ready: bool = False) -> ReadySample:
        return ReadySample(self.sample(logits, rows))

    def rows_to_host(self, logits: Any, rows: Any) -> Any:
        return self.inner.rows_to_host(logits, rows)
