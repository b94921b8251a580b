"""What the server needs of an engine, whichever way it runs.

Two implementations: ``EngineLoop`` (engine_loop.py: the engine in a worker thread of this
process) and ``EngineClient`` (engine_client.py: the engine in a process of its own). The
server's state, routes and metrics read only this surface, never an engine's internals, so
either can serve. ``LoadPeaks`` is the queue/page peak bookkeeping both keep for /metrics;
``EngineLimits`` the request checks of an engine that runs elsewhere.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Protocol, Sequence

from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.server.stream import RequestStream


class EngineUnavailable(Exception):
    """The engine has stopped or is unhealthy; requests get 503."""


class ServingEngine(Protocol):
    tokenizer: Any  # crucible.model.tokenizer.Tokenizer: the front's own
    max_context: int
    num_pages: int  # the KV pool's pages (a request must fit it alone)
    max_queue: int  # the waiting-queue bound
    unhealthy_reason: str
    other_fronts: list[dict[str, Any]]  # other fronts' metrics (server/fronts.py); else []

    @property
    def running(self) -> bool:
        """False once stopped, unhealthy or gone: /health and every API answer 503."""

    @property
    def stats(self) -> dict[str, Any]:
        """A snapshot for /metrics: the engine's counters plus the peaks and failures."""

    @property
    def num_pending(self) -> int:
        """Accepted requests the engine has not queued yet (the bound counts them)."""

    def next_id(self, prefix: str) -> str: ...

    async def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                     request_id: str, cache_salt: str | None = None) -> RequestStream:
        """Queue one request; QueueFullError / RequestError / EngineUnavailable at once."""

    def abort(self, request_id: str) -> None:
        """End a request (a no-op once it ended); its pages are back before the next step."""

    async def fresh_stats(self) -> dict[str, Any]:
        """The engine's counters now (a round trip when it runs in another process)."""

    async def stop(self) -> None: ...


class LoadPeaks:
    """Peaks of queued requests and used pages, sampled at submissions, refusals and steps.

    Preempted requests go back to the head of the waiting queue, beyond the bound if need
    be (they were accepted already), so two queue peaks are kept: new requests waiting
    (never above the bound) and all waiting requests. Accepted requests the engine has not
    queued yet (``pending``) wait too: the bound counts them, so the peaks do as well."""

    def __init__(self) -> None:
        self.queue_peak = 0
        self.waiting_peak = 0
        self.pages_peak = 0

    def sample(self, st: dict[str, Any], pending: int, preempted: int,
               failures: int) -> dict[str, Any]:
        used = st["pages_total"] - st["pages_free"]
        waiting = st["waiting"] + pending
        self.pages_peak = max(self.pages_peak, used)
        self.waiting_peak = max(self.waiting_peak, waiting)
        self.queue_peak = max(self.queue_peak, waiting - preempted)
        st.update(pages_used=used, queue_peak=self.queue_peak, pages_peak=self.pages_peak,
                  waiting_preempted=preempted, waiting_peak=self.waiting_peak,
                  failures=failures)
        return st


class EngineLimits:
    """An engine's fixed limits, for a front that has no engine object (its engine runs in
    another process). ``check_request`` is LLMEngine's own, so the front refuses at once
    exactly what the engine would refuse."""

    check_request = LLMEngine.check_request

    def __init__(self, max_context: int, vocab_size: int, num_pages: int) -> None:
        self.max_context = max_context
        self.vocab_size = vocab_size
        self.allocator = SimpleNamespace(num_pages=num_pages)
