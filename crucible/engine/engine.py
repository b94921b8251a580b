"""LLMEngine: the step loop. schedule -> build batch -> validate -> forward -> sample -> update.

The engine owns the requests, the page allocator and the scheduler; the runner only turns a
validated PackedBatch into logits. One ``step()`` is one packed forward. Output comes back
as ``RequestDelta`` increments (new tokens/text since the last step), which the offline API
accumulates and the async engine streams.

Sampling runs where the logits are: a device sampler (``runner.sampler``) gets each row as a
``RowSampling`` (crucible/step/rows.py) and returns ids and requested logprobs, and only
prompt-logprob rows come to the host; else the host sampler (engine/sampling.py) runs. Both
draw the same (seed, n) way, so deltas and stops do not depend on which ran.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from crucible.step.rows import RowSampling
from crucible.step.batch import PackedBatch, build_packed_batch
from crucible.engine.pages import PageAllocator, pages_for
from crucible.engine.pipeline import Launched, plan_chained
from crucible.engine.prefix_cache import PrefixCache, cache_counters
from crucible.engine.request import Request, RequestStatus
from crucible.engine.rng import derive_seed
from crucible.engine.sampling import SamplingParams, log_softmax, top_logprobs
from crucible.engine.scheduler import ScheduledSlice, Scheduler, SchedulerConfig
from crucible.engine.step_rows import Draw, device_updates, host_updates, sampling_rows
from crucible.engine.validate import validate_packed_batch
from crucible.errors import RequestError
from crucible.engine.runner import ModelRunner
from crucible.step.batch import PAGE_SIZE
from crucible.step.quick_init import quick_init

Logprobs = dict[int, float]


@quick_init  # built for every request at every step
@dataclass(frozen=True)
class RequestDelta:
    """What one request gained in one step (or its end)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    new_logprobs: tuple[Logprobs, ...] | None  # one per new token when logprobs were asked
    prompt_logprobs: tuple[Logprobs | None, ...] | None  # once, in the first delta after prefill
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    num_cached_tokens: int  # prompt positions its first admission found in the prefix cache


class LLMEngine:
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
        self._inflight: Launched | None = None  # a queued step whose results are not applied
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
        bad = [t for t in prompt_token_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary "
                               f"[0, {self.vocab_size})")
        # The last sampled token is never fed back, so a request computes at most this many.
        need = pages_for(min(n + params.max_tokens - 1, self.max_context))
        if need > self.allocator.num_pages:
            raise RequestError(f"the request needs {need} pages, the pool has only "
                               f"{self.allocator.num_pages}; lower max_tokens or the prompt")

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, final_only: bool = False,
                    cache_salt: str | None = None, use_prefix_cache: bool = True) -> str:
        """``final_only``: the caller wants the output once, when the request ends (as
        ``LLM.generate`` does), not step by step: no delta is built before that one, and it
        carries no text unless stop strings made the engine keep it (the caller decodes the
        ids, ``model/detokenize.py:decode_all``). ``cache_salt``: requests share cached
        pages only with requests of the same salt. ``use_prefix_cache=False`` (health
        probes, warm-up) neither reads nor fills the cache; prompt logprobs need every
        prompt row computed, so a request asking for them does not read it either."""
        if cache_salt is not None and (not isinstance(cache_salt, str) or len(cache_salt) > 256):
            raise RequestError("cache_salt must be a string of at most 256 characters")
        params = params or SamplingParams()
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
        req = Request(rid, [int(t) for t in prompt_token_ids], params, seed=seed,
                      arrival=arrival, eos_ids=self.eos_ids, tokenizer=text)
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

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """Run one step and return what it produced. With a runner that can pipeline
        (crucible/engine/pipeline.py) the next decode step is queued before this one's
        results are read, so one step may still be in flight when this returns."""
        while True:
            cur = self._inflight
            if cur is None:
                if self.prefix_cache is not None:
                    self.prefix_cache.follow(self.runner.backend.arithmetic)
                plan = self.scheduler.schedule()
                if not plan.slices:
                    return []
                cur = self._launch(plan.slices,
                                   build_packed_batch([s.segment() for s in plan.slices]))
            self._inflight = self._chain(cur)
            deltas, live = self._collect(cur)
            if live:  # else every row of cur belonged to requests that ended meanwhile
                return deltas

    def _launch(self, slices: Sequence[ScheduledSlice], batch: PackedBatch,
                rows: Sequence[RowSampling] | None = None,
                feed: np.ndarray | None = None) -> Launched:
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
        host_rows: list[int] = []
        if rows is None:
            rows, host_rows = sampling_rows(slices, self.vocab_size)
        pending = self.runner.launch_sample(batch, rows, host_rows, feed)
        return Launched(tuple(slices), pending, None, len(rows))

    def _chain(self, cur: Launched) -> Launched | None:
        nxt = plan_chained(cur, self.scheduler.running, bool(self.scheduler.waiting),
                           self.allocator, self.max_context,
                           self.runner.chain_rows)
        if nxt is None:
            return None
        self.num_chained += 1
        return self._launch(nxt.slices, nxt.batch, nxt.rows, nxt.feed)

    def _collect(self, cur: Launched) -> tuple[list[RequestDelta], bool]:
        updates = cur.updates if cur.updates is not None else device_updates(cur, self.vocab_size)
        deltas, live = [], False
        finished, update, append = RequestStatus.FINISHED, self._update, deltas.append
        for sl, prompt_logits, draw in updates:
            if sl.request.status is finished:
                continue  # it ended after this step was queued: the row is dropped
            live = True
            delta = update(sl, prompt_logits, draw)
            if delta is not None:
                append(delta)
        return deltas, live

    def _update(self, sl: ScheduledSlice, prompt_logits: np.ndarray | None,
                draw: Draw) -> RequestDelta | None:
        req = sl.request
        req.num_computed_tokens += sl.length
        cache = self.prefix_cache
        if cache is not None and req.use_cache and \
                req.num_computed_tokens >= (req.num_published + 1) * PAGE_SIZE:
            self._publish(cache, req)
        for i, r in enumerate(sl.prompt_rows):
            p = sl.start + r  # row p predicts prompt token p + 1
            lp = log_softmax(prompt_logits[i])
            req.prompt_logprobs.append(top_logprobs(lp, req.params.prompt_logprobs,
                                                    req.token_ids[p + 1]))
        if draw is None:  # the slice does not sample
            return None
        if callable(draw):  # the host sampler runs now (timed as a stage under --profile)
            res = draw() if self.stage_timer is None else self.stage_timer("sampling", draw)
            token, logprobs = res.token_id, res.logprobs
        else:
            token, logprobs = draw
        req.token_ids.append(token)
        self.num_generated += 1
        if req.logprobs is not None:
            req.logprobs.append(logprobs)
        reason = self._stop_reason(req, token)
        if reason is not None:
            self.scheduler.finish(req, reason)
            del self.requests[req.request_id]
        elif req.final_only:
            return None
        return self._delta(req)

    @staticmethod
    def _publish(cache: PrefixCache, req: Request) -> None:
        """Index the pages this step completed: their K/V writes are done (the step's
        results are back), and every later reader comes after them in stream order."""
        ids, pages = req.token_ids, req.page_table.pages
        for i in range(req.num_published, req.num_computed_tokens // PAGE_SIZE):
            cache.publish(pages[i], i, ids[i * PAGE_SIZE : (i + 1) * PAGE_SIZE],
                          req.cache_salt, req.chain)
        req.num_published = req.num_computed_tokens // PAGE_SIZE

    def _stop_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        num_tokens = len(req.token_ids)  # `token` included; read once (this runs per row)
        num_output = num_tokens - req.num_prompt_tokens
        text = req.output_text
        if token in req.stop_ids:
            text.finish()  # the stop token's own text is never shown
            return "stop"
        if text.streams and text.add(token, num_output >= p.min_tokens):  # stop strings
            return "stop"
        if num_output >= p.max_tokens or num_tokens >= self.max_context:
            text.finish()
            return "length"
        return None

    def _delta(self, req: Request) -> RequestDelta:
        done = req.status is RequestStatus.FINISHED
        ids = req.token_ids
        emitted = req.num_prompt_tokens + req.num_tokens_emitted
        new_ids = (ids[-1],) if emitted == len(ids) - 1 else tuple(ids[emitted:])
        req.num_tokens_emitted += len(new_ids)
        new_lp = None
        if req.logprobs is not None:
            new_lp = tuple(req.logprobs[req.num_logprobs_emitted :])
            req.num_logprobs_emitted = len(req.logprobs)
        prompt_lp = None
        if req.prompt_logprobs is not None and not req.prompt_logprobs_emitted:
            prompt_lp = tuple(req.prompt_logprobs)
            req.prompt_logprobs_emitted = True
        return RequestDelta(req.request_id, new_ids, req.output_text.take_delta(done), new_lp,
                            prompt_lp, done, req.finish_reason, req.num_cached_tokens)

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
        }

    def cache_stats(self) -> dict[str, int]:
        """The prefix cache's counters and what it holds (all zero without a cache)."""
        return cache_counters(self.prefix_cache)
