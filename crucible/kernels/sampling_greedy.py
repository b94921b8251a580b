"""Greedy rows over many CTAs per row (cuda/sampling_greedy.cu).

``sample_rows`` (cuda/sampling.cu) gives each row one 512-thread block, so a greedy row of a
large vocabulary is one block's long sweep. When every row of a step is
greedy with nothing else asked of it (``greedy_only``), ``GreedyLauncher`` splits each row over
``slices_for(V)`` CTAs instead; the token is the same one, bit for bit: the index of the
largest logit (-0.0 tying with +0.0), the lowest index winning ties.

The launcher owns the kernel's scratch: one u64 partial per CTA and one u32 counter per row.
The counters are zeroed once, when allocated; each launch leaves them at zero again, so a
launch needs no memset and can be replayed from a CUDA graph (size the scratch with a launch
of the step's largest row count before capturing: a capture must not reallocate it).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from crucible.step.row_buffer import pack_rows
from crucible.step.rows import RowSampling, greedy_only
from crucible.kernels.source import KernelModule, cached_module

THREADS = 256  # GREEDY_THREADS in sampling_greedy.cu
SLICE = 2048  # elements per CTA: 256 threads x 2 float4s, one pass; V = 49152 -> 24 CTAs
MAX_ROWS = 65535  # rows go on grid y


def _cupy() -> Any:
    import cupy

    return cupy


def module() -> KernelModule:
    return cached_module("sampling_greedy.cu")


@functools.cache
def _kernel() -> Any:
    return module().get_function("greedy_rows")


def slices_for(vocab: int, slice_len: int = SLICE) -> int:
    """CTAs per row. slices_for(V) * slice >= V covers the row whatever its alignment head."""
    return max(1, -(-vocab // slice_len))


class GreedyLauncher:
    """Launches ``greedy_rows`` over a step's rows; owns its persistent scratch."""

    def __init__(self, slice_len: int = SLICE) -> None:
        if slice_len <= 0 or slice_len % 4:
            raise ValueError(f"greedy slice must be a positive multiple of 4, got {slice_len}")
        self.slice_len = slice_len
        self._part: Any = None  # u64 [>= rows * slices]
        self._counters: Any = None  # u32 [>= rows], zero between launches

    def reserve(self, rows: int, vocab: int) -> None:
        """Allocate the scratch for launches of up to ``rows`` rows of ``vocab`` now (before a
        graph captures a launch, which must not reallocate it)."""
        self._scratch(rows, slices_for(vocab, self.slice_len))

    def _scratch(self, r: int, s: int) -> tuple[Any, Any]:
        cp = _cupy()
        if self._counters is None or self._counters.size < r:
            # Grown, never shrunk: steady-state steps allocate nothing.
            self._counters = cp.zeros(max(r, 64), cp.uint32)
        if self._part is None or self._part.size < r * s:
            self._part = cp.empty(max(r, 64) * s, cp.uint64)
        return self._part, self._counters

    def launch(self, logits: Any, meta_dev: Any, r: int, tokens_out: Any) -> None:
        """tokens_out[:r] = the greedy tokens of the first r rows of ``meta_dev`` (the int64
        device copy of ``pack_rows``; None: row i is logits row i). logits: C-contiguous f32 CuPy [rows, V]; inputs are
        the caller's to check (``tokens`` does), as with CupySampler.launch."""
        if r <= 0:
            return
        if r > MAX_ROWS:
            raise ValueError(f"greedy sampler: {r} rows, at most {MAX_ROWS} per launch")
        vocab = int(logits.shape[1])
        s = slices_for(vocab, self.slice_len)
        part, counters = self._scratch(r, s)
        _kernel()(
            (s, r), (THREADS,),
            (logits, np.int32(vocab), np.uint64(0) if meta_dev is None else meta_dev,
             np.int32(r), np.int32(s),
             np.int32(self.slice_len), part, counters, tokens_out))

    def tokens(self, logits: Any, rows: Sequence[RowSampling]) -> np.ndarray:
        """The greedy tokens of ``rows`` (which must satisfy ``greedy_only``) on the host."""
        cp = _cupy()
        if not greedy_only(rows):
            raise ValueError("greedy sampler: every row must be greedy, without entries or "
                             "logprobs")
        if not isinstance(logits, cp.ndarray) or logits.dtype != cp.float32 or logits.ndim != 2 \
                or not logits.flags.c_contiguous:
            raise ValueError("greedy sampler: logits must be a C-contiguous f32 CuPy array "
                             "[rows, vocab]")
        meta = cp.asarray(pack_rows(rows, logits.shape[0], logits.shape[1]))
        out = cp.empty(len(rows), cp.int32)
        self.launch(logits, meta, len(rows), out)
        return cp.asnumpy(out)
