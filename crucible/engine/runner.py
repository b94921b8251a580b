"""ModelRunner: a loaded model bound to a backend and a page pool.

The engine hands it validated packed batches. It returns the final rows' logits on the host
(``forward``), or, when the backend has a device sampler, samples them where they are
(``launch_sample``): only token ids, requested top-N logprobs and the few rows the engine
asks for come back. It makes no policy decision (which rows, which pages, how to sample):
that is the scheduler's and the request's.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from crucible.backend.protocol import Backend
from crucible.backend.select import make_backend
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.model import llama
from crucible.model.config import ModelConfig
from crucible.model.loader import LoadedModel
from crucible.step.batch import PackedBatch
from crucible.step.rows import (PendingSample, RowSampler, RowSampling, SampleOutput,
                                greedy_rows_in_order)


class ModelRunner:
    def __init__(self, model: LoadedModel, *, num_pages: int | Callable[[Backend], int],
                 device: str = "cpu",
                 attention: str | None = None, settings: Settings | None = None,
                 device_sampling: bool = True, backend: Backend | None = None) -> None:
        """``settings``: the start-up settings (default: the built-in defaults, no
        environment); ``attention`` overrides their attention variant. ``backend``: one
        already built (else ``settings`` build it for ``device``). ``device_sampling``:
        sample on the device where the backend can. ``num_pages``: the pool's pages, or a
        function of the backend that decides them once the weights are uploaded (so it can
        size the pool by the memory left)."""
        if not callable(num_pages):
            _check_pages(num_pages)
        settings = settings or Settings()
        if attention is not None:
            settings = settings.replace(attention=attention)
        self.model = model
        self.pipeline = settings.pipeline  # queue decode step t+1 before t's ids are read
        self.num_argmax_steps = 0  # steps whose ids a decode graph's argmax gave
        self.backend: Backend = backend or make_backend(device, settings.backend_options())
        self.device = self.backend.device
        self.backend.load_weights(model.config, model.backend_tensors())
        if callable(num_pages):
            num_pages = _check_pages(num_pages(self.backend))
        self.num_pages = num_pages
        self.backend.allocate_pool(num_pages)
        # None: the engine samples on the host from ``forward``'s logits.
        self.sampler: RowSampler | None = (self.backend.device_sampler() if device_sampling
                                           else None)

    def capture_graphs(self, max_rows: int) -> int:
        """The backend's start-up captures for steps of up to ``max_rows`` rows (how many)."""
        return self.backend.capture_graphs(self._forward_meta, max_rows)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def _forward_meta(self, meta: Any) -> Any:
        return llama.forward_meta(self.model.config, self.backend, meta)

    def forward(self, batch: PackedBatch) -> np.ndarray:
        """f32 logits [len(batch.final_rows), vocab] on the host; K/V of every row land in
        the pool."""
        return self.backend.to_host(self.forward_device(batch))

    def forward_device(self, batch: PackedBatch, feed: np.ndarray | None = None) -> Any:
        """The same logits where the backend made them (valid until the next step)."""
        # Past the context the RoPE tables and the graphs' page tables end: a kernel would
        # read beyond them, so such a step is refused here, before any launch.
        ctx = self.model.config.max_context
        if batch.positions.size and int(batch.positions.max()) >= ctx:
            raise ValueError(f"step positions reach {int(batch.positions.max())}, past the "
                             f"model's context of {ctx} positions")
        return self.backend.run_step(batch, self._forward_meta, feed)

    def forward_sample(self, batch: PackedBatch, rows: Sequence[RowSampling],
                       host_rows: Sequence[int] = ()) -> tuple[SampleOutput, np.ndarray]:
        """One step sampled by ``self.sampler``: (the sampled rows' ids and logprobs, in the
        order of ``rows``; f32 logits of the final rows listed in ``host_rows``)."""
        return self.launch_sample(batch, rows, host_rows).result()

    def graph_stats(self) -> dict[str, int]:
        """How the steps so far ran: backend/protocol.py GRAPH_STATS."""
        return self.backend.graph_stats()

    def first_use(self, batch: PackedBatch, fed: bool) -> bool:
        """Whether launching ``batch`` would be a graph's first use (a capture, or an eager
        forward of a shape a graph kind takes but has no graph for yet)."""
        return self.backend.first_use(batch, fed)

    @property
    def chain_rows(self) -> int:
        """The most rows a pipelined decode step may have (0: this runner cannot pipeline).
        Such a step (``launch_sample(..., feed=...)``) is queued before the previous step's
        ids reach the host: its rows read them on the device."""
        if not self.pipeline or self.sampler is None:
            return 0
        buf = self.backend.fed_ids(1)
        return 0 if buf is None else int(buf.shape[0])

    @property
    def mixed_feed_rows(self) -> int | None:
        """The fewest rows of a fed step that holds prefill slices (engine/pipeline_next.py),
        or None when only decode steps can be fed."""
        return self.backend.mixed_feed_rows() if self.chain_rows else None

    def launch_sample(self, batch: PackedBatch, rows: Sequence[RowSampling],
                      host_rows: Sequence[int] = (), feed: np.ndarray | None = None
                      ) -> "PendingStep":
        """Queue one sampled step without waiting for its ids (``forward_sample`` waits).
        ``feed``: per row, the index among the previous launch's sampled rows (at most
        ``chain_rows``) whose id is this row's input token (-1: the batch's own)."""
        if self.sampler is None:
            raise RuntimeError("launch_sample: this runner has no device sampler")
        be = self.backend
        logits = self.forward_device(batch, None if feed is None else np.asarray(feed, np.int32))
        want = (int(batch.final_rows.shape[0]), self.config.vocab_size)
        if tuple(logits.shape) != want:
            raise RuntimeError(f"backend returned logits of shape {tuple(logits.shape)}, "
                               f"expected {want}")
        host = self.sampler.rows_to_host(logits, host_rows)
        if not rows:
            return PendingStep(None, SampleOutput((), ()), host)
        # A decode graph already ran the greedy argmax of its rows (cupy_graphs.py): when
        # that is all these rows ask for, only the copy back is queued.
        ready = be.sampled_ids(len(rows)) if greedy_rows_in_order(rows) else None
        if ready is not None:
            pending = self.sampler.sample_async(logits, rows, ready, ready=True)
            self.num_argmax_steps += 1
        else:
            pending = self.sampler.sample_async(logits, rows, be.fed_ids(len(rows)))
        if pending.event is not None:
            be.ids_copied(pending.event)
        return PendingStep(pending, None, host)


def _check_pages(num_pages: Any) -> int:
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages <= 0:
        raise ConfigError(f"num_pages must be a positive whole number, got {num_pages!r}")
    return num_pages


class PendingStep:
    """A launched step: ``result()`` waits for (SampleOutput, host logits rows)."""

    def __init__(self, pending: PendingSample | None, out: SampleOutput | None,
                 host: np.ndarray) -> None:
        self._pending, self._out, self._host = pending, out, host

    def result(self) -> tuple[SampleOutput, np.ndarray]:
        if self._out is None:
            self._out = self._pending.result()
        return self._out, self._host

    def done(self) -> bool:
        """Whether ``result()`` would return without waiting on the device."""
        return self._out is not None or self._pending.done()
