"""Per-request state: owned and mutated only by the scheduler/engine (slotted, not frozen).

A request is its token list (prompt, then generated tokens) plus ``num_computed_tokens``,
the number of leading tokens whose K/V sit in its pages. There is no prefill/decode phase:
``num_tokens - num_computed_tokens`` rows remain to compute; when that is 1 the request is
decoding. Preemption drops the pages and sets ``num_computed_tokens`` back to 0; the token
list (and so the next draw counter ``len(output)``) is kept, so recomputation is exact.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from crucible.engine.pages import PageTable
from crucible.engine.sampling import SamplingParams
from crucible.step.quick_init import quick_init
from crucible.step.rows import RowSampling, plain_fields, plain_row

Logprobs = dict[int, float]


class TokenIds(list):
    """A prompt's ids that our own code built as a list of Python ints (the async engine's
    ``add``, the engine process's wire decoding): ``LLMEngine.add_request`` takes it as it
    is. Any other sequence is converted id by id, which for a chat turn's ~1,500 ids was
    ~40% of an arrival's host time on the engine's thread."""

    __slots__ = ()


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued: new, or preempted and waiting to be recomputed
    RUNNING = "running"  # admitted: holds pages, gets rows every step it fits
    FINISHED = "finished"


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

    @classmethod
    def aborted(cls, request_id: str) -> "RequestDelta":
        """The last delta of a request ended by an abort: no tokens, finish reason "abort"."""
        return cls(request_id, (), "", None, None, True, "abort", 0)


class OutputText:
    """Generated text with stop-string handling on top of an incremental detokenizer.

    The text never includes a stop token's text or a stop string (nor anything after it).
    While streaming, the last ``max(len(stop)) - 1`` characters are held back, because they
    could be the start of a stop string that the next token completes. Only the text not
    handed out yet is kept (``take_delta`` drops the rest): a stop string that the next
    token completes starts at most that many characters back, inside what is kept.

    ``clean``: nothing is held back or pending and no stop strings apply, so the next
    token's delta is its whole text, ``lookup(token)`` (None when the token is not whole
    characters or not met yet), with nothing to change here. The engine's decode step
    reads it so (engine/updates.py); ``add`` then ``take_delta`` give the same.
    """

    __slots__ = ("_detok", "_stop", "_holdback", "_tail", "streams", "clean", "lookup")

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self._detok = tokenizer.detokenizer() if tokenizer is not None else None
        self.streams = self._detok is not None  # False: no text is kept (nobody reads it)
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._tail = ""  # text not handed out yet
        self.clean = self.streams and not stop
        self.lookup = self._detok.whole.get if self.streams else None

    def add(self, token_id: int, check_stop: bool = True) -> bool:
        """Append a generated (non-stop) token's text; True if a stop string appeared.

        ``check_stop`` is False before ``min_tokens``: stop strings do not count yet.
        """
        if self._detok is None:
            return False
        old = len(self._tail)
        self._tail += self._detok.add(token_id)
        self.clean = False  # until take_delta hands the text out
        return check_stop and self._check_stop(old)

    def finish(self) -> None:
        """End of the stream for a reason other than a stop string: flush held bytes."""
        if self._detok is not None:
            old = len(self._tail)
            self._tail += self._detok.flush()
            self.clean = False
            self._check_stop(old)

    def _check_stop(self, old_len: int) -> bool:
        if not self._stop:
            return False
        # A stop string can only end inside the new characters, so start just before them.
        begin = max(0, old_len - self._holdback)
        hits = [i for i in (self._tail.find(s, begin) for s in self._stop) if i >= 0]
        if not hits:
            return False
        self._tail = self._tail[: min(hits)]
        return True

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out, minus the held-back tail unless the request finished."""
        if not self.streams:
            return ""
        tail = self._tail
        end = len(tail) if finished else max(0, len(tail) - self._holdback)
        self._tail = tail[end:]
        self.clean = not self._stop and not self._tail and not self._detok.has_pending
        return tail[:end]


class Request:
    __slots__ = (
        "request_id", "params", "seed", "arrival", "num_prompt_tokens", "token_ids",
        "num_computed_tokens", "page_table", "status", "finish_reason", "stop_ids",
        "logprobs", "prompt_logprobs", "num_preemptions", "output_text",
        "num_tokens_emitted", "num_logprobs_emitted", "prompt_logprobs_emitted", "plain",
        "final_only", "argmax_from", "cache_salt", "use_cache", "chain", "num_published",
        "num_cached_tokens", "waits_on",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 *, seed: int, arrival: int, eos_ids: tuple[int, ...], tokenizer: Any) -> None:
        self.request_id = request_id
        self.params = params
        self.seed = seed
        self.arrival = arrival
        self.num_prompt_tokens = len(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.page_table = PageTable()
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        # Tokens that end generation (and are masked before min_tokens).
        self.stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else frozenset(eos_ids))
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        # Entry i is the distribution of prompt token i given tokens < i; entry 0 is None.
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        self.num_preemptions = 0
        # The constant fields of its entry-free sampling rows (None: its rows carry entries).
        self.plain = plain_fields(params, seed)
        # From this many output tokens on, its draw is the plain argmax (None: never).
        self.argmax_from = params.min_tokens if params.plain_greedy(params.min_tokens) else None
        self.output_text = OutputText(tokenizer, params.stop)
        # Streaming cursors: what has already been handed to the client.
        self.final_only = False  # one delta, when the request ends (LLMEngine.add_request)
        # Prefix cache (engine/prefix_cache.py): whether it may look up and publish pages,
        # its tenant salt, the keys of its full pages so far, how many of its pages are
        # published, and the prompt positions its first admission found cached.
        self.use_cache = True
        self.cache_salt: str | None = None
        self.chain: list[bytes] = []
        self.num_published = 0
        self.num_cached_tokens = 0
        # While waiting: (the running request filling its next pages, that page's index),
        # engine/filling.py
        self.waits_on: tuple[Request, int] | None = None
        self.num_tokens_emitted = 0
        self.num_logprobs_emitted = 0
        self.prompt_logprobs_emitted = False

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def plain_row(self, logits_row: int, num_output: int) -> RowSampling | None:
        """Its sampling row after ``num_output`` generated tokens when the row carries no
        entries (no penalty, ``min_tokens`` met), else None (``row_sampling`` reads the
        history then)."""
        if self.plain is None or num_output < self.params.min_tokens:
            return None
        return plain_row(self.plain, logits_row, num_output)

    def sampler_history(self) -> tuple[list[int], list[int]]:
        """(prompt, output) as a sampler reads them. The prompt matters only to the
        repetition penalty, so without one it is not copied (this runs every step for every
        running request, and prompts can be long)."""
        prompt = self.prompt_token_ids if self.params.repetition_penalty != 1.0 else []
        return prompt, self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_remaining(self) -> int:
        """Rows still to compute before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def wants_prompt_logprobs_up_to(self) -> int:
        """Prompt rows (positions) whose logits are still needed for prompt logprobs."""
        if self.prompt_logprobs is None:
            return 0
        # Row p predicts prompt token p + 1; rows 0 .. num_prompt - 2 are needed.
        short = len(self.prompt_logprobs) < self.num_prompt_tokens
        return self.num_prompt_tokens - 1 if short else 0

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, pages={len(self.page_table)})")
