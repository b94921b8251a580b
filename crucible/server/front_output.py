"""Text for a request whose engine runs in another process: ids in, the engine's deltas out.

The engine process sends token ids only (``LLMEngine.detokenize`` is off there). This
turns each step's ids back into the ``RequestDelta`` the in-process engine would have
built, with the same code in the same order as ``LLMEngine._stop_reason`` and ``_delta``:
the request's ``OutputText`` (crucible/engine/request.py: incremental UTF-8-safe
detokenising, stop strings, the held-back tail) sees each token once; a stop token flushes
it, other tokens are added and may complete a stop string, the last token of a
length-finished request flushes it. So text, finish reasons, the tokens kept and the
streamed pieces are identical to in-process serving.

Stop strings end a request here, not in the engine: the delta is cut after the token that
completed one (its later ids and logprobs dropped, as if the engine had stopped there),
and the caller aborts the engine's request, which may already have run ahead.
"""

from __future__ import annotations

from typing import Any

from crucible.engine.core_wire import WireDelta
from crucible.engine.engine import RequestDelta
from crucible.engine.request import OutputText
from crucible.engine.sampling import SamplingParams


class FrontOutput:
    """One request's text state on the front. Not thread-safe: one thread feeds it."""

    __slots__ = ("request_id", "text", "min_tokens", "num_output", "done")

    def __init__(self, request_id: str, params: SamplingParams, tokenizer: Any) -> None:
        self.request_id = request_id
        self.text = OutputText(tokenizer, params.stop)
        self.min_tokens = params.min_tokens
        self.num_output = 0
        self.done = False  # its last delta is built: later engine output is dropped

    def feed(self, w: WireDelta) -> tuple[RequestDelta | None, bool]:
        """(the delta to hand on or None after the end, True if a stop string ended the
        request here while the engine still runs it)."""
        if self.done:
            return None, False
        ids, reason = w.token_ids, w.finish_reason
        text, last = self.text, len(w.token_ids) - 1
        keep, cut = len(ids), False
        for i, token in enumerate(ids):
            self.num_output += 1
            if i == last and reason == "stop":  # the engine stopped on a stop token id
                text.finish()  # its own text is never shown
                break
            if text.add(token, self.num_output >= self.min_tokens):
                keep, cut = i + 1, reason is None  # None: the engine still runs it
                reason = "stop"
                break
            if i == last and reason == "length":
                text.finish()
        lps = w.logprobs
        if keep < len(ids):
            ids = ids[:keep]
            lps = lps[:keep] if lps is not None else None
        finished = reason is not None
        self.done = finished
        # An abort hands out nothing more, held-back text included (as in-process).
        new_text = "" if reason == "abort" else text.take_delta(finished)
        return RequestDelta(self.request_id, ids, new_text, lps, w.prompt_logprobs, finished,
                            reason, w.num_cached_tokens), cut
