"""Applying a step's results to its requests: tokens, counts, stops, deltas, cache pages.

``StepUpdates`` is the half of ``LLMEngine`` (engine.py) that runs after the sampler
answered. A scheduled step goes slice by slice through ``_update``, the general path:
prompt logprobs, host draws, prefill ends, every stop rule. The decode rows of a
pipelined step (``DecodeRows``, pipeline.py; a pipelined mixed step's slices follow them)
are one vectorised pass first: from its columns and the
sampled ids it finds the rows that may end now (length, a stop id), may complete a cache
page, or keep logprobs or stop strings; only those take ``_update``. Every other row
cannot end or publish, so it appends its token and, when its caller streams, gets its
delta straight away: the token's kept whole text when its ``OutputText`` is ``clean``,
else what the detokenizer gives (a piece of a character, a token not met yet). The result
is the same as ``_update`` on every row: same tokens, text, logprobs, finish reasons,
deltas in the same order, same pages published and freed in the same order.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from crucible.engine.pipeline import DecodeRows, Launched
from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.request import Request, RequestDelta, RequestStatus
from crucible.engine.sampling import log_softmax, top_logprobs
from crucible.engine.scheduler import ScheduledSlice
from crucible.engine.step_rows import Draw, device_updates
from crucible.step.batch import PAGE_SIZE

if TYPE_CHECKING:
    from crucible.engine.scheduler import Scheduler


class StepUpdates:
    """What LLMEngine does with a step's results (mixed into it)."""

    scheduler: Scheduler
    requests: dict[str, Request]
    prefix_cache: PrefixCache | None
    max_context: int
    vocab_size: int
    num_generated: int
    stage_timer: Callable[[str, Callable[[], Any]], Any] | None

    def _collect(self, cur: Launched) -> tuple[list[RequestDelta], bool]:
        """The step's deltas, and whether any of its rows still belonged to a live
        request."""
        if cur.decode is not None and not cur.slices:
            return self._collect_rows(cur)
        updates = cur.updates if cur.updates is not None else device_updates(cur, self.vocab_size)
        deltas: list[RequestDelta] = []
        live = False
        if cur.decode is not None:  # a pipelined mixed step: its decode rows in one pass
            out = cur.pending.result()[0]
            n = len(cur.decode.requests)
            deltas, dropped, general = self._apply_rows(cur.decode, out.token_ids[:n],
                                                        out.logprobs[:n])
            self.num_generated += n - dropped - general
            live = dropped < n
        finished, update, append = RequestStatus.FINISHED, self._update, deltas.append
        for sl, prompt_logits, draw in updates:
            if sl.request.status is finished:
                continue  # it ended after this step was queued: the row is dropped
            live = True
            delta = update(sl, prompt_logits, draw)
            if delta is not None:
                append(delta)
        return deltas, live

    def _collect_rows(self, cur: Launched) -> tuple[list[RequestDelta], bool]:
        """A pipelined decode step's results (see the module docstring)."""
        rows = cur.decode
        assert rows is not None
        out, host = cur.pending.result()
        n = len(rows.requests)
        if len(out.token_ids) != n or host.shape != (0, self.vocab_size):
            raise RuntimeError(f"device sampler returned {len(out.token_ids)} tokens and "
                               f"{host.shape} host rows, expected {n} and "
                               f"{(0, self.vocab_size)}")
        deltas, dropped, general = self._apply_rows(rows, out.token_ids, out.logprobs)
        self.num_generated += n - dropped - general  # _update counted its own
        return deltas, dropped < n

    def _apply_rows(self, rows: DecodeRows, tokens: Sequence[int],
                    logprobs: Sequence[Any]) -> tuple[list[RequestDelta], int, int]:
        """Decode rows' ids applied: (deltas, rows dropped, rows that took ``_update``)."""
        n = len(rows.requests)
        slow = rows.slow | (rows.counters + 1 >= rows.limits)  # may end by length
        if self.prefix_cache is not None:
            # A page can only complete on its last slot; _update decides whether it does.
            slow |= (rows.positions + 1) % PAGE_SIZE == 0
        stops = rows.stop_ids
        if stops and not stops.isdisjoint(tokens):
            slow |= np.fromiter((t in stops for t in tokens), bool, n)
        flags = slow.tolist() if slow.any() else repeat(False)
        deltas: list[RequestDelta] = []
        append, update, finished = deltas.append, self._update, RequestStatus.FINISHED
        dropped = general = 0
        for req, token, lps, general_row in zip(rows.requests, tokens, logprobs, flags):
            if req.status is finished:
                dropped += 1  # it ended after this step was queued: the row is dropped
                continue
            if not general_row:
                req.num_computed_tokens += 1
                req.token_ids.append(token)
                if req.final_only:  # no delta before its end
                    continue
                text = req.output_text
                new_text = text.lookup(token) if text.clean else None
                if new_text is None:
                    if text.streams:  # part of a character, or a token not met yet
                        text.add(token)  # no stop strings here (those rows are slow)
                        new_text = text.take_delta(False)
                    else:  # nobody reads its text (the engine process)
                        new_text = ""
                # A streaming request had every earlier token in a delta.
                req.num_tokens_emitted += 1
                append(RequestDelta(req.request_id, (token,), new_text, None, None, False,
                                    None, req.num_cached_tokens))
                continue
            general += 1
            delta = update(ScheduledSlice(req, req.num_computed_tokens, 1, (), True), None,
                           (token, lps))
            if delta is not None:
                append(delta)
        return deltas, dropped, general

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
        end = req.num_computed_tokens // PAGE_SIZE
        cache.publish_run(req.page_table.pages, req.num_published, end, req.token_ids,
                          req.cache_salt, req.chain)
        req.num_published = end

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

    @staticmethod
    def _delta(req: Request) -> RequestDelta:
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
