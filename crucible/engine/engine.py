"""LLMEngine: the step loop. schedule -> build batch -> validate -> forward -> sample -> update.

The engine owns the requests, the page allocator and the scheduler; the runner only turns a
validated PackedBatch into logits. One ``step()`` is one packed forward. Output comes back
as ``RequestDelta`` increments (new tokens/text since the last step), which the offline API
accumulates and the async engine streams.

Sampling runs where the logits are: a device sampler (``runner.sampler``) gets each row as a
``RowSampling`` (crucible/step/rows.py) and returns ids and requested logprobs, and only
prompt-logprob rows come to the host; else the host sampler (engine/sampling.py) runs. Both
draw the same (seed, n) way, so deltas and stops do not depend on which ran. What a step's
results do to its requests (tokens, stops, deltas) is engine/updates.py.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from crucible.step.rows import RowSampling
from crucible.step.batch import PackedBatch, build_packed_batch
from crucible.engine.intake import first_out_of_vocab, integer_array
from crucible.engine.pacing import Pacer
from crucible.engine.pages import PageAllocator, pages_for
from crucible.engine.pipeline import DecodeRows, Launched
from crucible.engine.pipeline_next import NextStep, plan_next
from crucible.engine.prefix_cache import PrefixCache, cache_counters
from crucible.engine.request import Logprobs, Request, RequestDelta, RequestStatus, TokenIds
from crucible.engine.rng import derive_seed
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import ScheduledSlice, Scheduler, SchedulerConfig
from crucible.engine.step_rows import host_updates, sampling_rows
from crucible.engine.updates import StepUpdates
from crucible.engine.validate import validate_packed_batch
from crucible.errors import RequestError
from crucible.engine.runner import ModelRunner

__all__ = ["LLMEngine", "Logprobs", "RequestDelta"]  # the delta is imported from here


def _requests(nxt: NextStep) -> Iterable[Request]:
    """The requests a planned step has rows of."""
    decode = () if nxt.decode is None else nxt.decode.requests
    return itertools.chain(decode, (sl.request for sl in nxt.slices))


class LLMEngine(StepUpdates):
    def __init__(self, runner: ModelRunner, tokenizer: Any = None,
                 config: SchedulerConfig | None = None, *, seed: int = 0,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config or SchedulerConfig()
        self.prefix_cache = prefix_cache  # None: every request computes its whole prompt
        self.allocator = PageAllocator(runner.num_pages, prefix_cache)
        self.scheduler = Scheduler(self.config, self.allocator)
        self.max_context = runner.config.max_context
        self.vocab_size = runner.config.vocab_size
        self.eos_ids: tuple[int, ...] = tuple(tokenizer.stop_token_ids) if tokenizer else ()
        # False: ids-only deltas, no stop strings here: the caller (the server's engine
        # process) detokenises and checks them itself.
        self.detokenize = True
        self.requests: dict[str, Request] = {}  # unfinished requests only
        self._seed_base = seed
        self._counter = itertools.count()  # arrivals: request ids and derived seeds
        self.num_steps = 0
        self.num_rows = 0
        self.num_generated = 0
        self.num_chained = 0  # steps queued by the pipeline, before the previous one's ids
        self.num_chained_mixed = 0  # those of them that hold prefill slices
        self._inflight: Launched | None = None  # a queued step whose results are not applied
        # A step planned ahead whose launch is a graph's first use (a capture or an eager
        # forward: many ms of host time), held until the step before it was collected.
        self._deferred: NextStep | None = None
        self.num_deferred = 0
        # Late planning (engine/pacing.py): set by a serving loop that takes arrivals.
        self.pacer: Pacer | None = None
        # --profile: (stage, fn) -> fn(), timed; host sampling runs through it.
        self.stage_timer: Callable[[str, Callable[[], Any]], Any] | None = None

    # -- requests -------------------------------------------------------------------------
    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise RequestError if this request can never be served as given."""
        n = len(prompt_token_ids)
        if n == 0:
            raise RequestError("the prompt is empty; at least one token is needed")
        if n > self.max_context:
            raise RequestError(f"the prompt has {n} tokens, more than the model's context of "
                               f"{self.max_context} tokens")
        bad = first_out_of_vocab(prompt_token_ids, self.vocab_size)
        if bad is not None:
            raise RequestError(f"prompt token id {bad} is outside the vocabulary "
                               f"[0, {self.vocab_size})")
        # The last sampled token is never fed back, so a request computes at most this many.
        need = pages_for(min(n + params.max_tokens - 1, self.max_context))
        if need > self.allocator.num_pages:
            raise RequestError(f"the request needs {need} pages, the pool has only "
                               f"{self.allocator.num_pages}; lower max_tokens or the prompt")

    def checked_ids(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> TokenIds:
        """``check_request``, then the ids as ``add_request(..., checked=True)`` takes them
        (engine/intake.py: one conversion serves both where the ids are integers)."""
        arr = integer_array(prompt_token_ids)
        self.check_request(prompt_token_ids if arr is None else arr, params)
        return TokenIds(arr.tolist() if arr is not None else map(int, prompt_token_ids))

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, final_only: bool = False,
                    cache_salt: str | None = None, use_prefix_cache: bool = True,
                    checked: bool = False) -> str:
        """``final_only``: the caller wants the output once, when the request ends (as
        ``LLM.generate`` does), not step by step: no delta is built before that one, and it
        carries no text unless stop strings made the engine keep it (the caller decodes the
        ids, ``model/detokenize.py:decode_all``). ``cache_salt``: requests share cached
        pages only with requests of the same salt. ``use_prefix_cache=False`` (health
        probes, warm-up) neither reads nor fills the cache; prompt logprobs need every
        prompt row computed, so a request asking for them does not read it either.
        ``checked``: the caller has run ``check_request`` on these ids and params (the async
        engine's ``add`` on arrival, ``LLM.generate`` before it adds any), so it is not run
        twice: for a chat turn's ~1,500 ids it was half of this call (27 of 52 us on the
        CPU, on the engine's thread while a cohort's step waits). The engine process checks
        again what its fronts send: another process's check is a second line there."""
        if cache_salt is not None and (not isinstance(cache_salt, str) or len(cache_salt) > 256):
            raise RequestError("cache_salt must be a string of at most 256 characters")
        params = params or SamplingParams()
        if not checked:
            self.check_request(prompt_token_ids, params)
        if request_id is not None and request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        self.scheduler.check_room()  # before taking an arrival number (it seeds the request)
        arrival = next(self._counter)
        rid = request_id if request_id is not None else f"req-{arrival}"
        if rid in self.requests:
            raise RequestError(f"request id {rid!r} is already in use")
        seed = params.seed if params.seed is not None else derive_seed(self._seed_base, arrival)
        text = self.tokenizer if self.detokenize and (not final_only or params.stop) \
            else None
        ids = prompt_token_ids if type(prompt_token_ids) is TokenIds \
            else list(map(int, prompt_token_ids))
        req = Request(rid, ids, params, seed=seed, arrival=arrival, eos_ids=self.eos_ids,
                      tokenizer=text)
        req.final_only = final_only
        req.use_cache = use_prefix_cache and params.prompt_logprobs is None
        req.cache_salt = cache_salt
        self.scheduler.add(req)
        self.requests[rid] = req
        return rid

    def abort(self, request_id: str) -> bool:
        """End a request now; its pages are free before the next step. False if unknown."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish(req, "abort")
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def device_busy(self) -> bool:
        """Whether a step queued ahead (a pipelining runner's) is still running on the
        device: host time spent now does not hold the device up."""
        cur = self._inflight
        return cur is not None and cur.pending is not None and not cur.pending.done()

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """Run one step and return what it produced. With a runner that can pipeline
        (crucible/engine/pipeline_next.py) the next step is queued before this one's
        results are read, so one step may still be in flight when this returns."""
        while True:
            cur = self._inflight
            if cur is None and self._deferred is not None:
                cur = self._launch_deferred()
            if cur is None:
                if self.prefix_cache is not None:
                    self.prefix_cache.follow(self.runner.backend.arithmetic)
                plan = self.scheduler.schedule()
                if not plan.slices:
                    return []
                cur = self._launch(plan.slices,
                                   build_packed_batch([s.segment() for s in plan.slices]))
            pacer = self.pacer
            if pacer is not None and cur.pending is not None:  # plan t+1 near t's end
                sched = self.scheduler
                pacer.wait(cur.pending, not sched.waiting
                           and len(sched.running) < sched.config.max_running)
            self._queue_next(cur)
            deltas, live = self._collect(cur)
            if pacer is not None and cur.pending is not None:
                pacer.ended()
            if live:  # else every row of cur belonged to requests that ended meanwhile
                return deltas

    def _launch(self, slices: Sequence[ScheduledSlice], batch: PackedBatch,
                rows: Sequence[RowSampling] | None = None,
                feed: np.ndarray | None = None, decode: DecodeRows | None = None,
                host_rows: Sequence[int] = ()) -> Launched:
        validate_packed_batch(batch, num_pages=self.allocator.num_pages,
                              vocab_size=self.vocab_size,
                              max_pages_per_table=pages_for(self.max_context))
        self.num_steps += 1
        self.num_rows += batch.num_rows
        if self.runner.sampler is None:
            # --profile times each host draw as a stage: no batched argmax then.
            updates = host_updates(self.runner, slices, batch, self.vocab_size,
                                   batch_greedy=self.stage_timer is None)
            return Launched(tuple(slices), None, updates, 0)
        if rows is None:
            rows, host_rows = sampling_rows(slices, self.vocab_size)
        pending = self.runner.launch_sample(batch, rows, host_rows, feed)
        if self.pacer is not None:
            self.pacer.launched()
        return Launched(tuple(slices), pending, None, len(rows), decode)

    def _queue_next(self, cur: Launched) -> None:
        """Plan step t+1 from ``cur`` and launch it (``_inflight``), or hold it
        (``_deferred``) when its launch is a graph's first use: that would keep the host
        for a capture or an eager forward while cur's tokens wait behind it, so they go out
        first and the next call launches it (its fed rows still find cur's ids on the
        device). (A method, so the planned rows die with the launch: held through the
        collection's allocations, 256 rows a step were promoted and set off full garbage
        collections, ~0.1 ms a step at 256 running in bench/host_step.py.)"""
        self._inflight = None
        nxt = self._plan_next(cur)
        if nxt is None:
            return
        if self.runner.first_use(nxt.batch, nxt.feed is not None):
            self._deferred = nxt
            self.num_deferred += 1
        else:
            self._inflight = self._launch_next(nxt)

    def _launch_deferred(self) -> Launched | None:
        """Launch the held step, or drop it when every request it has rows of ended."""
        nxt, self._deferred = self._deferred, None
        if any(r.status is RequestStatus.RUNNING for r in _requests(nxt)):
            return self._launch_next(nxt)
        return None

    def _plan_next(self, cur: Launched) -> NextStep | None:
        """Step t+1 planned before step t's results are applied, or None
        (engine/pipeline_next.py)."""
        runner = self.runner
        if self.prefix_cache is not None and self.scheduler.waiting:  # admissions may hit
            self.prefix_cache.follow(runner.backend.arithmetic)
        return plan_next(cur, self.scheduler, self.max_context, self.vocab_size,
                         runner.chain_rows, runner.mixed_feed_rows)

    def _launch_next(self, nxt: NextStep) -> Launched:
        self.num_chained += 1
        self.num_chained_mixed += any(sl.length > 1 for sl in nxt.slices)
        return self._launch(nxt.slices, nxt.batch, nxt.rows, nxt.feed, nxt.decode,
                            host_rows=nxt.host_rows)

    def stats(self) -> dict[str, int]:
        return {
            "pages_total": self.allocator.num_pages,
            "pages_free": self.allocator.num_free,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "steps": self.num_steps,
            "preemptions": self.scheduler.num_preemptions,
            "rows_computed": self.num_rows,
            "tokens_generated": self.num_generated,
            **self.cache_stats(),
            **self.runner.graph_stats(),
        }

    def cache_stats(self) -> dict[str, int]:
        """The prefix cache's counters and what it holds (all zero without a cache)."""
        return cache_counters(self.prefix_cache)
