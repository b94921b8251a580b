"""What a device sampler needs to know about one row, and the sampler's interface.

The engine turns each sampling row (a request's params and token history) into a
``RowSampling``: plain numbers plus the row's *distinct* penalised token ids with their output
counts and the stop ids that ``min_tokens`` masks. So the sampler never sees a request, and
the per-row work is independent of how long the history is beyond its distinct ids. Each
entry carries flags REP (divide/multiply by the repetition penalty), PEN (subtract
presence + frequency * count) and MASK (-inf: a stop id before min_tokens); a token id appears
in at most one entry. ``crucible.step.row_buffer`` lays a step's rows out for the device.

Penalties follow ``crucible.engine.sampling`` exactly: REP on every distinct prompt + output
id when the penalty is not 1; PEN on every distinct output id when the output is non-empty and
a presence or frequency penalty is set; MASK on every stop id inside the vocabulary while
fewer than ``min_tokens`` tokens were generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from crucible.step.quick_init import quick_init

REP, PEN, MASK = 1, 2, 4
MAX_LOGPROBS = 20
MASK64 = (1 << 64) - 1
Logprobs = dict[int, float]
_NONE = np.zeros(0, np.int32)
_NONE.flags.writeable = False


@quick_init  # built for every sampling row at every step
@dataclass(frozen=True)
class RowSampling:
    """One row to sample: ``logits_row`` of the step's final-row logits, and how."""

    logits_row: int
    temperature: float
    top_k: int  # 0: off
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int  # reduced to 64 bits
    counter: int  # n in uniform(seed, n): the number of tokens generated so far
    num_logprobs: int | None
    entry_ids: np.ndarray  # int32, ascending, distinct
    entry_counts: np.ndarray  # int32, output occurrences (used with PEN)
    entry_flags: np.ndarray  # int32, REP | PEN | MASK

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def greedy_only(rows: Sequence[RowSampling]) -> bool:
    """True when the greedy argmax gives every row's answer (cuda/sampling_greedy.cu):
    temperature 0, no entries (the penalties and min_tokens masking reach the device only as
    entries, so a row without any takes sample_rows' plain greedy branch whatever its penalty
    fields say) and no logprobs. False for no rows: there is nothing to launch, and pack_rows
    rejects an empty step."""
    return bool(rows) and all(r.temperature == 0 and r.entry_ids.size == 0
                              and r.num_logprobs is None for r in rows)


def greedy_rows_in_order(rows: Sequence[RowSampling]) -> bool:
    """``greedy_only``, and row i samples logits row i (a decode step's rows): the argmax
    a decode graph ran over its rows is these rows' answer."""
    return greedy_only(rows) and all(r.logits_row == i for i, r in enumerate(rows))


def plain_fields(params: Any, seed: int) -> dict[str, Any] | None:
    """The fields of a request's entry-free rows that are the same at every step (all but
    the logits row and the counter), or None when its rows carry penalty entries. A request
    computes them once; ``plain_row`` then builds each step's row from them."""
    if not (params.repetition_penalty == 1.0 and not params.presence_penalty
            and not params.frequency_penalty):
        return None
    return dict(logits_row=0, temperature=float(params.temperature),
                top_k=int(params.top_k or 0), top_p=float(params.top_p),
                min_p=float(params.min_p), repetition_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0, seed=int(seed) & MASK64, counter=0,
                num_logprobs=params.logprobs, entry_ids=_NONE, entry_counts=_NONE,
                entry_flags=_NONE)


def plain_row(fields: dict[str, Any], logits_row: int, counter: int) -> RowSampling:
    """The RowSampling of ``plain_fields`` at one step: a copy of the fields with the two
    that change (this runs for every sampling row at every step; filling the record's own
    dict from the fields is a few times cheaper than its 14-argument constructor, and a
    third cheaper than handing it a copy through ``object.__setattr__``)."""
    row = object.__new__(RowSampling)
    d = row.__dict__
    d.update(fields)
    d["logits_row"], d["counter"] = logits_row, counter
    return row


def plain_row_sampling(logits_row: int, params: Any, *, num_output: int,
                       seed: int) -> RowSampling | None:
    """The RowSampling of a row with no entries (no penalty, and ``min_tokens`` met after
    ``num_output`` generated tokens), or None when the row needs its token history (then
    call ``row_sampling``)."""
    fields = plain_fields(params, seed)
    if fields is None or num_output < params.min_tokens:
        return None
    return plain_row(fields, int(logits_row), num_output)


def row_sampling(logits_row: int, params: Any, *, prompt: Sequence[int], output: Sequence[int],
                 seed: int, stop_ids: Iterable[int], vocab_size: int) -> RowSampling:
    """The RowSampling of one request (``params``: a SamplingParams) at its next draw."""
    plain = plain_row_sampling(logits_row, params, num_output=len(output), seed=seed)
    if plain is not None:
        return plain
    flags: dict[int, int] = {}
    counts: dict[int, int] = {}
    if params.repetition_penalty != 1.0:
        for t in set(prompt) | set(output):
            flags[int(t)] = REP
    if output and (params.presence_penalty or params.frequency_penalty):
        for t in output:
            counts[int(t)] = counts.get(int(t), 0) + 1
        for t in counts:
            flags[t] = flags.get(t, 0) | PEN
    if len(output) < params.min_tokens:
        for t in stop_ids:
            if 0 <= t < vocab_size:
                flags[int(t)] = flags.get(int(t), 0) | MASK
    base = dict(logits_row=int(logits_row), temperature=float(params.temperature),
                top_k=int(params.top_k or 0), top_p=float(params.top_p),
                min_p=float(params.min_p), repetition_penalty=float(params.repetition_penalty),
                presence_penalty=float(params.presence_penalty),
                frequency_penalty=float(params.frequency_penalty), seed=int(seed) & MASK64,
                counter=len(output), num_logprobs=params.logprobs)
    if not flags:  # the common case: no penalties, no masking
        return RowSampling(**base, entry_ids=_NONE, entry_counts=_NONE, entry_flags=_NONE)
    ids = np.array(sorted(flags), dtype=np.int64)
    if ids.size and (ids[0] < 0 or ids[-1] >= vocab_size):
        bad = int(ids[0] if ids[0] < 0 else ids[-1])
        raise ValueError(f"token id {bad} in the history is outside the vocabulary "
                         f"[0, {vocab_size})")
    return RowSampling(
        **base, entry_ids=ids.astype(np.int32),
        entry_counts=np.array([counts.get(int(t), 0) for t in ids], dtype=np.int32),
        entry_flags=np.array([flags[int(t)] for t in ids], dtype=np.int32))



@dataclass(frozen=True)
class SampleOutput:
    """A sampler's answer for a step's rows, in the order they were given."""

    token_ids: tuple[int, ...]
    logprobs: tuple[Logprobs | None, ...]  # top-N (rank order) plus the sampled token


class PendingSample(Protocol):
    """A queued sampling call. ``event`` is the device event its ids arrive by (None: the
    result is already on the host)."""

    event: Any

    def result(self) -> SampleOutput: ...


@dataclass(frozen=True)
class ReadySample:
    """A sampling call that finished where it was made (a host-side sampler)."""

    out: SampleOutput
    event: Any = None

    def result(self) -> SampleOutput:
        return self.out


class RowSampler(Protocol):
    """What the runner needs of a sampler that works on logits where the backend made them:
    queue the sampling of rows (``sample_async``; ``sample`` waits for it) and fetch a few raw
    rows to the host (prompt logprobs)."""

    def sample(self, logits: Any, rows: Sequence[RowSampling]) -> SampleOutput: ...

    def sample_async(self, logits: Any, rows: Sequence[RowSampling], tokens_out: Any = None,
                     ready: bool = False) -> PendingSample:
        """``tokens_out``: where the ids go on the device (for a fed next step); ``ready``:
        it already holds them (a decode graph's argmax), only the copy back is queued."""

    def rows_to_host(self, logits: Any, rows: Sequence[int]) -> np.ndarray: ...
