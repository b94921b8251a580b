"""The device sampler (cuda/sampling.cu and its .cuh helpers): sample rows of device logits,
return only the ids.

One launch samples every row of a step; each 512-thread block takes one row at a time. The
step's sampling metadata (``sampling_meta.pack_rows``) goes up in one host-to-device copy;
the int32 token ids come back, plus the small top-N logprob arrays only when a row asked.

Exactness contract (what ``llm-engine gpu-sampling`` checks). Per row the device runs the
pipeline of ``crucible.engine.sampling.sample_row`` in f64, in the same order, with the same
counter-based draw u = uniform(seed, n) computed on the device bit for bit (SplitMix64):
  * penalties, masking, temperature division, candidate order (value desc, id asc, ties at
    the k-th value by id), greedy argmax: exactly the host's f64 values and decisions;
  * the weights exp(y - y_max) use CUDA's exp and the candidates' total is a fixed tree,
    not numpy's pairwise sum, so weights and totals may differ from the host's in the last
    bits. Every top_p / min_p / draw decision is otherwise the host's own: cumulative sums
    are taken with an error bound that covers the host's sequential rounding, and when the
    bound cannot decide, one thread recomputes the sums in the host's order. Where all
    weights are exact (tied logits: weights 1 and 0), the tokens equal the host's exactly;
    otherwise they differ only when u * total (or top_p) lands within rounding of a
    cumulative-weight boundary, about 1e-13 per draw;
  * logprobs (raw log-softmax, top-N by (logprob desc, id asc) plus the sampled token) are
    within 1e-9 of the host's f64 values (in practice a few ulps);
  * a row's result depends only on its own logits and metadata (fixed reduction trees, no
    order-dependent atomics): batch invariant and identical run to run, bitwise.
NaN logits are outside the contract (the host sampler does not define them either).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from crucible.step.row_buffer import LP_WORDS, pack_rows
from crucible.step.rows import RowSampling, SampleOutput, greedy_only, greedy_rows_in_order
from crucible.kernels.sampling_greedy import GreedyLauncher
from crucible.backend.cupy_pinned import PinnedRing, device_buffer
from crucible.kernels.loader import sm_count
from crucible.kernels.source import KernelModule, cached_module

THREADS = 512  # THREADS in sampling.cu
MAX_VOCAB = 1 << 24  # ids are u32 in the sort; far above any real vocabulary


def _cupy() -> Any:
    import cupy

    return cupy


def module() -> KernelModule:
    return cached_module("sampling.cu")


@functools.cache
def _kernel(name: str) -> Any:
    return module().get_function(name)


class CupySampler:
    """Samples rows of a CuPy f32 logits array [rows, vocab] on the device.

    Scratch (four [slots, vocab] arrays, 24 bytes per entry; slots = one block per SM at most)
    and the output buffers are allocated on first use and again only when a step needs more
    rows, more concurrent blocks or another vocabulary: steady-state steps allocate only the
    metadata upload, from CuPy's pool."""

    name = "cupy"

    def __init__(self, max_slots: int | None = None, split_greedy: bool = True) -> None:
        self.max_slots = max_slots  # concurrent blocks (default: one per SM)
        # Plain greedy steps on the row-splitting argmax (False: one block per row, as the
        # other rows; both give the same ids, gpu-sampling checks it).
        self.split_greedy = split_greedy
        self._greedy = GreedyLauncher()
        self._last_r = 0
        self._scratch: tuple[Any, ...] | None = None
        self._shape = (0, 0)
        self._out: tuple[Any, Any, Any] | None = None  # tokens, route flags, logprob words
        self._paths: Any = None  # the last call's route flags per row (PATH_* in sampling.cu)
        self._meta: Any = None  # the metadata's device buffer (grown, never per step)
        # One ring per kind of copy: the engine keeps two steps in flight, so a step's ids
        # must not share slots with the next step's metadata or logprob words.
        self._up, self._ids, self._lps = PinnedRing(), PinnedRing(), PinnedRing()
        self._copy_stream: Any = None  # where the ids go back (sample_async)
        self._copied: Any = None  # the last copy's event: the next launch waits for it

    def _scratch_for(self, slots: int, vocab: int) -> tuple[Any, ...]:
        cp = _cupy()
        have_slots, have_vocab = self._shape
        if self._scratch is None or slots > have_slots or vocab != have_vocab:
            slots = max(slots, have_slots if vocab == have_vocab else 0)
            self._scratch = (cp.empty((slots, vocab), cp.uint64), cp.empty((slots, vocab), cp.uint64),
                             cp.empty((slots, vocab), cp.uint32), cp.empty((slots, vocab), cp.uint32))
            self._shape = (slots, vocab)
        return self._scratch

    def _outputs(self, rows: int) -> tuple[Any, Any, Any]:
        cp = _cupy()
        if self._out is None or self._out[0].shape[0] < rows:
            n = max(rows, 64)
            self._out = (cp.empty(n, cp.int32), cp.empty(n, cp.int32),
                         cp.empty((n, LP_WORDS), cp.int64))
        return self._out

    def sample(self, logits: Any, rows: Sequence[RowSampling]) -> SampleOutput:
        return self.sample_async(logits, rows).result()

    def sample_async(self, logits: Any, rows: Sequence[RowSampling],
                     tokens_out: Any = None, ready: bool = False) -> "PendingSample":
        """Queue the sampling of ``rows`` and the copy of their ids back; nothing here waits
        for the device. ``tokens_out`` (int32 device array, >= len(rows)): where the kernel
        writes the ids, for a next step that reads them on the device. ``ready``: it
        already holds them (a decode graph's argmax, for ``greedy_rows_in_order`` rows):
        only the copy is queued."""
        cp = _cupy()
        if not isinstance(logits, cp.ndarray) or logits.dtype != cp.float32 or logits.ndim != 2 \
                or not logits.flags.c_contiguous:
            raise ValueError("device sampler: logits must be a C-contiguous f32 CuPy array "
                             f"[rows, vocab], got {type(logits).__name__} "
                             f"{getattr(logits, 'dtype', '?')} {getattr(logits, 'shape', '?')}")
        num_logits, vocab = logits.shape
        if not 1 <= vocab <= MAX_VOCAB:
            raise ValueError(f"device sampler: vocabulary of {vocab} outside [1, {MAX_VOCAB}]")
        r = len(rows)
        if r == 0:
            return PendingSample(None, None, None, rows)
        stream = cp.cuda.get_current_stream()
        if ready:
            if tokens_out is None or r > num_logits or not greedy_rows_in_order(rows):
                raise ValueError("device sampler: ready ids need plain greedy rows in logits "
                                 "order and the buffer holding them")
            tokens, lp = tokens_out, None
        else:
            greedy = self.split_greedy and greedy_only(rows)
            # The copies back run on a stream of their own, so the next step (queued behind
            # this one on ``stream``) does not wait for them; the next kernel waits for them
            # instead, since it rewrites the buffers they read.
            if self._copied is not None:
                stream.wait_event(self._copied)
            tokens, lp = self.launch(logits, self._upload_meta(rows, greedy, num_logits, vocab),
                                     r, tokens_out, greedy=greedy)
        if self._copy_stream is None:
            self._copy_stream = cp.cuda.Stream(non_blocking=True)
        copy = self._copy_stream
        copy.wait_event(stream.record())
        ids = self._ids.download(tokens[:r], copy)  # 4 bytes a row come back ...
        lps = None
        if any(row.num_logprobs is not None for row in rows):
            lps = self._lps.download(lp[:r], copy)  # ... unless logprobs were asked
        self._copied = copy.record()
        if ready:
            self._last_r, self._paths = r, None  # every row took the greedy route
        return PendingSample(self._copied, ids, lps, rows)

    def _upload_meta(self, rows: Sequence[RowSampling], greedy: bool, num_logits: int,
                     vocab: int) -> Any:
        """The rows' metadata on the device (the step's one upload), or None for greedy rows
        in logits order: row i samples logits row i, nothing to upload (a decode step)."""
        cp = _cupy()
        if greedy and len(rows) <= num_logits and greedy_rows_in_order(rows):
            return None
        host_meta = pack_rows(rows, num_logits, vocab)
        self._meta = device_buffer(self._meta, host_meta.size, cp.int64)
        meta = self._meta[: host_meta.size]
        self._up.upload(host_meta, meta, cp.cuda.get_current_stream())
        return meta

    def launch(self, logits: Any, meta: Any, r: int, tokens_out: Any = None,
               greedy: bool = False) -> tuple[Any, Any]:
        """The kernel alone over checked inputs (``sample`` checks them; timings call this):
        device (tokens [>= r], logprob words [>= r, 43]), valid until the next call.
        ``greedy``: every row is greedy without entries or logprobs (``greedy_only``), so the
        row-splitting argmax (cuda/sampling_greedy.cu) gives the same ids, faster."""
        tokens, paths, lp = self._outputs(r)
        if tokens_out is not None:
            tokens = tokens_out
        self._last_r = r
        if greedy:
            self._greedy.launch(logits, meta, r, tokens)
            self._paths = None  # every row took the greedy route (PATH_GREEDY)
            return tokens, lp
        vocab = logits.shape[1]
        slots = min(r, self.max_slots or sm_count())
        keys, keys2, ids1, ids2 = self._scratch_for(slots, vocab)
        self._paths = paths[:r]
        _kernel("sample_rows")(
            (slots,), (THREADS,),
            (logits, np.int32(vocab), meta, np.int32(r), keys, keys2, ids1, ids2, tokens, lp,
             paths))
        return tokens, lp

    def last_paths(self) -> np.ndarray:
        """Route flags of the last call's rows: 1 full-row sort, 2 a decision redone in the
        host's sequential order, 4 top_k past the shared-memory prefix, 8 greedy on f32,
        16 the first 256 candidates did not decide (the 2048-candidate prefix ran), 32 the
        draw past the first 256 located by narrowing the key range (no sort)."""
        if self._paths is None:
            return np.full(self._last_r, 8, np.int32)
        return _cupy().asnumpy(self._paths)

    def rows_to_host(self, logits: Any, rows: Sequence[int]) -> np.ndarray:
        cp = _cupy()
        if not rows:
            return np.empty((0, logits.shape[1]), np.float32)
        return cp.asnumpy(logits[cp.asarray(np.asarray(rows, np.int64))])


class PendingSample:
    """A queued sampling call: ``result()`` waits for its ids (and logprobs) to arrive."""

    def __init__(self, event: Any, ids: np.ndarray | None, lps: np.ndarray | None,
                 rows: Sequence[RowSampling]) -> None:
        self._event, self._ids, self._lps, self._rows = event, ids, lps, rows

    @property
    def event(self) -> Any:
        """The copy back's event (None: nothing was sampled)."""
        return self._event

    def done(self) -> bool:
        """Whether the ids are in (the copy back's event has completed)."""
        return self._event is None or bool(self._event.done)

    def result(self) -> SampleOutput:
        if self._event is None:
            return SampleOutput((), ())
        self._event.synchronize()
        ids = tuple(int(t) for t in self._ids)  # copied out before the ring slot returns
        lps: list[dict[int, float] | None] = [None] * len(self._rows)
        if self._lps is not None:
            lps = unpack_logprobs(np.array(self._lps), self._rows)
        return SampleOutput(ids, tuple(lps))


def unpack_logprobs(lp: np.ndarray, rows: Sequence[RowSampling]) -> list[dict[int, float] | None]:
    """The kernel's [R, 43] words -> {token: logprob} per row (rank order, then the sample)."""
    out: list[dict[int, float] | None] = []
    half = (LP_WORDS - 1) // 2
    for i, row in enumerate(rows):
        if row.num_logprobs is None:
            out.append(None)
            continue
        n = int(lp[i, 0])
        if not 1 <= n <= half:
            raise RuntimeError(f"device sampler returned {n} logprobs for row {i}")
        vals = lp[i, 1 + half : 1 + half + n].view(np.float64)
        out.append({int(t): float(v) for t, v in zip(lp[i, 1 : 1 + n], vals)})
    return out


def device_draws(seeds: Sequence[int], counters: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(bits u64, uniforms f64) of rng.random_bits / rng.uniform computed on the device."""
    cp = _cupy()
    s = cp.asarray(np.array([x & ((1 << 64) - 1) for x in seeds], dtype=np.uint64))
    c = cp.asarray(np.asarray(counters, dtype=np.uint64))
    n = int(s.size)
    bits, uni = cp.empty(n, cp.uint64), cp.empty(n, cp.float64)
    if n:
        _kernel("rng_draws")((-(-n // 256),), (256,),
                                            (s, c, bits, uni, np.int32(n)))
    return cp.asnumpy(bits), cp.asnumpy(uni)
