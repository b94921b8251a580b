"""ModelRunner: a loaded model bound to a backend and a page pool.

The engine hands it validated packed batches; it returns logits of the final rows
(``forward``), or, when the backend has a device sampler, samples them where they are
(``forward_sample``: only token ids, requested top-N logprobs and the few rows the engine
asks for come back to the host). It makes no policy decision (which rows, which pages, how
to sample): that is the scheduler's and the request's.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from crucible.backend.sampling_meta import (RowSampler, RowSampling, SampleOutput,
                                            greedy_rows_in_order)
from crucible.backend.select import env_flag, make_backend
from crucible.engine.batch import PackedBatch
from crucible.errors import ConfigError
from crucible.kernels.variants import variant_from_env
from crucible.model import llama
from crucible.model.config import ModelConfig
from crucible.model.loader import LoadedModel


class ModelRunner:
    def __init__(self, model: LoadedModel, *, num_pages: int, device: str = "cpu",
                 attention: str | None = None, device_sampling: bool = True) -> None:
        """``attention``: an attention variant name for the GPU backend (default: the
        CRUCIBLE_PREFILL_ATTN setting); the numpy backend has one canonical attention.
        ``device_sampling``: sample on the device where the backend can (CuPy)."""
        if num_pages <= 0:
            raise ConfigError(f"num_pages must be positive, got {num_pages}")
        # A bad CRUCIBLE_PREFILL_ATTN is a start-up error on every device, not only on GPUs.
        variant_from_env()
        self.model = model
        self.num_pages = num_pages
        # CRUCIBLE_PIPELINE=0: never queue a decode step before the previous one's ids are read.
        self.pipeline = env_flag("CRUCIBLE_PIPELINE")
        self.num_argmax_steps = 0  # steps whose ids a decode graph's argmax gave
        self.backend = make_backend(device, attention)
        self.device = "cuda" if self.backend.name != "numpy" else "cpu"
        self.backend.load_weights(model.config, model.weights, model.weights_mode)
        self.backend.allocate_pool(num_pages)
        # None: the engine samples on the host from ``forward``'s logits.
        self.sampler: RowSampler | None = None
        if device_sampling and self.backend.name == "cupy":
            from crucible.backend.cupy_sampling import CupySampler

            self.sampler = CupySampler()

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def forward(self, batch: PackedBatch) -> np.ndarray:
        """f32 logits [len(batch.final_rows), vocab]; K/V of every row land in the pool."""
        step = getattr(self.backend, "run_step", None)  # a backend with its own fast path
        if step is not None:
            return step(batch)
        return llama.forward(self.model.config, self.backend, batch)

    def forward_device(self, batch: PackedBatch) -> Any:
        """Logits [len(batch.final_rows), vocab] where the backend made them (a CuPy array
        on the GPU; valid until the next step)."""
        be = self.backend
        step = getattr(be, "run_step_device", None)
        if step is not None and getattr(be, "run_step", None) is not None:
            return step(batch)
        # No fast path (the numpy backend, or a profiling wrapper): the op-by-op forward.
        return llama.forward_meta(self.model.config, be, be.prepare(batch))

    def forward_sample(self, batch: PackedBatch, rows: Sequence[RowSampling],
                       host_rows: Sequence[int] = ()) -> tuple[SampleOutput, np.ndarray]:
        """One step sampled by ``self.sampler``: (the sampled rows' ids and logprobs, in the
        order of ``rows``; f32 logits of the final rows listed in ``host_rows``)."""
        return self.launch_sample(batch, rows, host_rows).result()

    @property
    def chain_rows(self) -> int:
        """The most rows a pipelined decode step may have (0: this runner cannot pipeline).
        Such a step (``launch_sample(..., feed=...)``) is queued before the previous step's
        ids reach the host: its rows read them on the device."""
        fed = getattr(self.backend, "fed_ids", None)
        if not self.pipeline or self.sampler is None or fed is None \
                or getattr(self.sampler, "sample_async", None) is None:
            return 0
        buf = fed(1)
        return 0 if buf is None else int(buf.shape[0])

    def launch_sample(self, batch: PackedBatch, rows: Sequence[RowSampling],
                      host_rows: Sequence[int] = (), feed: np.ndarray | None = None
                      ) -> "PendingStep":
        """Queue one sampled step without waiting for its ids (``forward_sample`` waits).
        ``feed``: per row, the index among the previous launch's sampled rows whose id is this
        row's input token (-1: the batch's own), for a decode step of at most ``chain_rows``."""
        if self.sampler is None:
            raise RuntimeError("forward_sample: this runner has no device sampler")
        if feed is not None:
            logits = self.backend.run_step_device(batch, feed=np.asarray(feed, np.int32))
        else:
            logits = self.forward_device(batch)
        want = (int(batch.final_rows.shape[0]), self.config.vocab_size)
        if tuple(logits.shape) != want:
            raise RuntimeError(f"backend returned logits of shape {tuple(logits.shape)}, "
                               f"expected {want}")
        host = self.sampler.rows_to_host(logits, host_rows)
        async_sample = getattr(self.sampler, "sample_async", None)
        if async_sample is None:  # a host-side twin: the result is ready at once
            out = self.sampler.sample(logits, rows) if rows else SampleOutput((), ())
            return PendingStep(None, out, host)
        be = self.backend
        fed = getattr(be, "fed_ids", None)
        # A decode graph already ran the greedy argmax of its rows (cupy_graphs.py): when
        # that is all these rows ask for, only the copy back is queued.
        done = getattr(be, "sampled_ids", None)
        ready = done(len(rows)) if done is not None and greedy_rows_in_order(rows) else None
        if ready is not None:
            pending = async_sample(logits, rows, ready, ready=True)
            self.num_argmax_steps += 1
        else:
            pending = async_sample(logits, rows, fed(len(rows)) if fed else None)
        note = getattr(be, "ids_copied", None)
        event = getattr(pending, "event", None)
        if note is not None and event is not None:
            note(event)
        return PendingStep(pending, None, host)


class PendingStep:
    """A launched step: ``result()`` waits for (SampleOutput, host logits rows)."""

    def __init__(self, pending: Any, out: SampleOutput | None, host: np.ndarray) -> None:
        self._pending, self._out, self._host = pending, out, host

    def result(self) -> tuple[SampleOutput, np.ndarray]:
        if self._out is None:
            self._out = self._pending.result()
        return self._out, self._host
