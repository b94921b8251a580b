"""What a device sampler needs to know about one row, and its one-buffer upload layout.

The engine turns each sampling row (a request's params and token history) into a
``RowSampling``: plain numbers plus the row's *distinct* penalised token ids with their output
counts and the stop ids that ``min_tokens`` masks. So the sampler never sees a request, and
the per-row work is independent of how long the history is beyond its distinct ids.

``pack_rows`` lays every row of a step out in ONE int64 buffer, uploaded with one
host-to-device copy (cuda/sampling.cu reads the same layout):

    words [16 * r, 16 * r + 16): row r's record (f64 fields stored as their bit patterns)
        0 temperature   1 top_p   2 min_p   3 repetition_penalty   4 presence_penalty
        5 frequency_penalty   6 seed (64 bits)   7 counter n (the draw index)
        8 top_k (0: off)   9 num_logprobs (-1: none)   10 first entry   11 entry count
        12 logits row   13..15 zero
    then the entries, two int64 words each, read as four int32: (token id, output count,
    flags, 0) with flags REP (divide/multiply by the repetition penalty), PEN (subtract
    presence + frequency * count) and MASK (-inf: a stop id before min_tokens). A token id
    appears in at most one entry, so the device applies each entry with no write conflicts.

Penalties follow ``crucible.engine.sampling`` exactly: REP on every distinct prompt + output
id when the penalty is not 1; PEN on every distinct output id when the output is non-empty and
a presence or frequency penalty is set; MASK on every stop id inside the vocabulary while
fewer than ``min_tokens`` tokens were generated.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from crucible.step.quick_init import quick_init

ROW_WORDS = 16
ENTRY_WORDS = 2  # int64 words per entry (four int32)
REP, PEN, MASK = 1, 2, 4
MAX_LOGPROBS = 20
LP_WORDS = 2 * (MAX_LOGPROBS + 1) + 1  # device output per row: count, ids, f64 logprob bits
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
    that change (this runs for every sampling row at every step; building the record from
    a dict copy is a few times cheaper than its 14-argument constructor)."""
    row = object.__new__(RowSampling)
    d = fields.copy()
    d["logits_row"], d["counter"] = logits_row, counter
    object.__setattr__(row, "__dict__", d)
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


def pack_rows(rows: Sequence[RowSampling], num_logits_rows: int, vocab_size: int) -> np.ndarray:
    """The step's sampling metadata as one int64 buffer (layout in the module docstring).

    Raises ValueError, naming the row, for anything the device could not sample safely."""
    if not rows:
        raise ValueError("pack_rows: no rows to sample")
    _check_columns(rows, num_logits_rows)
    if not any(r.entry_ids.size for r in rows):
        return _pack_records(rows)
    return _pack_columnar(rows, vocab_size)


_RECORD = struct.Struct("<6dQ9q")  # one row's 16 words, as the module docstring lays out
assert _RECORD.size == 8 * ROW_WORDS


def _pack_records(rows: Sequence[RowSampling]) -> np.ndarray:
    """Rows without entries (no penalties, min_tokens met: every greedy or plain sampled
    row): their records alone, packed field by field. Cheaper than the columnar numpy path
    for the small steps this covers; the words are the same (checked by the tests)."""
    buf = bytearray()
    for r in rows:
        buf += _RECORD.pack(r.temperature, r.top_p, r.min_p, r.repetition_penalty,
                            r.presence_penalty, r.frequency_penalty, r.seed, r.counter,
                            r.top_k, -1 if r.num_logprobs is None else r.num_logprobs,
                            0, 0, r.logits_row, 0, 0, 0)
    return np.frombuffer(buf, dtype=np.int64)  # a bytearray: writable, no copy


def _pack_columnar(rows: Sequence[RowSampling], vocab_size: int) -> np.ndarray:
    n = len(rows)
    # Columnar, so a 64-row decode step costs a few numpy calls rather than 64 x a few.
    f = np.array([(r.temperature, r.top_p, r.min_p, r.repetition_penalty, r.presence_penalty,
                   r.frequency_penalty) for r in rows], np.float64).reshape(n, 6)
    i = np.array([(r.counter, r.top_k, -1 if r.num_logprobs is None else r.num_logprobs,
                   r.logits_row, r.entry_ids.size) for r in rows], np.int64).reshape(n, 5)
    sizes = i[:, 4]
    starts = np.cumsum(sizes) - sizes
    buf = np.zeros(ROW_WORDS * n + ENTRY_WORDS * int(sizes.sum()), dtype=np.int64)
    rec = buf[: ROW_WORDS * n].reshape(n, ROW_WORDS)
    rec[:, :6] = f.view(np.int64)
    rec[:, 6] = np.array([r.seed for r in rows], np.uint64).view(np.int64)
    rec[:, 7:10] = i[:, :3]
    rec[:, 10], rec[:, 11], rec[:, 12] = starts, sizes, i[:, 3]
    if buf.size > ROW_WORDS * n:
        ent = buf[ROW_WORDS * n :].view(np.int32).reshape(-1, 4)
        ent[:, 0], ent[:, 1], ent[:, 2] = _entries(rows, sizes, vocab_size)
    return buf


def _check_columns(rows: Sequence[RowSampling], num_logits_rows: int) -> None:
    # Plain Python per row: for the few to a few hundred rows of a step this is several times
    # cheaper than a dozen numpy reductions. The reason is looked up only on failure.
    for k, r in enumerate(rows):
        if not (0 <= r.logits_row < num_logits_rows and 0 <= r.temperature < math.inf
                and r.top_k >= 0 and 0 < r.top_p <= 1 and 0 <= r.min_p <= 1
                and 0 < r.repetition_penalty < math.inf
                and math.isfinite(r.presence_penalty) and math.isfinite(r.frequency_penalty)
                and 0 <= r.counter < 2**62 and 0 <= r.seed <= MASK64
                and (r.num_logprobs is None or 0 <= r.num_logprobs <= MAX_LOGPROBS)):
            raise ValueError(f"sampling row {k} (logits row {r.logits_row}): "
                             f"{_problem(r, num_logits_rows)}")


def _problem(r: RowSampling, num_logits_rows: int) -> str:
    problems = [
        (0 <= r.logits_row < num_logits_rows, f"logits row outside [0, {num_logits_rows})"),
        (0 <= r.temperature < math.inf, "temperature must be finite and >= 0"),
        (r.top_k >= 0, "top_k must be >= 0 (0: off)"),
        (0 < r.top_p <= 1, "top_p must be in (0, 1]"),
        (0 <= r.min_p <= 1, "min_p must be in [0, 1]"),
        (0 < r.repetition_penalty < math.inf, "repetition_penalty must be finite and > 0"),
        (math.isfinite(r.presence_penalty) and math.isfinite(r.frequency_penalty),
         "penalties must be finite"),
        (0 <= r.counter < 2**62, "counter out of range"),
        (0 <= r.seed <= MASK64, "seed must be reduced to 64 bits"),
        (r.num_logprobs is None or 0 <= r.num_logprobs <= MAX_LOGPROBS,
         f"num_logprobs must be in [0, {MAX_LOGPROBS}] or None"),
    ]
    return next((msg for ok, msg in problems if not ok), "invalid")


def _entries(rows: Sequence[RowSampling], sizes: np.ndarray,
             vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All rows' entries concatenated, checked in one go (ids, counts, flags)."""
    for r in rows:
        if not r.entry_ids.size == r.entry_counts.size == r.entry_flags.size:
            raise ValueError(f"sampling row for logits row {r.logits_row}: entry arrays "
                             "differ in length")
    ids = np.concatenate([r.entry_ids for r in rows]).astype(np.int64)
    counts = np.concatenate([r.entry_counts for r in rows])
    flags = np.concatenate([r.entry_flags for r in rows])
    owner = np.repeat(np.arange(len(rows)), sizes)
    step_down = np.zeros(ids.size, bool)
    step_down[1:] = (owner[1:] == owner[:-1]) & (ids[1:] <= ids[:-1])
    for bad, msg in ((step_down, "entry ids must be distinct and ascending"),
                     ((ids < 0) | (ids >= vocab_size),
                      f"entry id outside the vocabulary [0, {vocab_size})"),
                     ((flags <= 0) | (flags > (REP | PEN | MASK)),
                      "entry flags must be a non-empty subset of REP|PEN|MASK"),
                     (counts < 0, "entry counts must be >= 0")):
        if bad.any():
            row = rows[int(owner[int(np.argmax(bad))])]
            raise ValueError(f"sampling row for logits row {row.logits_row}: {msg}")
    return ids, counts, flags


def unpack_rows(buf: np.ndarray, num_rows: int) -> list[dict[str, Any]]:
    """Read ``pack_rows``' buffer back (for the numpy twin and tests): one dict per row."""
    buf = np.asarray(buf, dtype=np.int64)
    ent = buf[ROW_WORDS * num_rows:].view(np.int32).reshape(-1, 4)
    out = []
    for i in range(num_rows):
        rec = buf[ROW_WORDS * i : ROW_WORDS * (i + 1)]
        f = rec[:6].view(np.float64)
        a, n = int(rec[10]), int(rec[11])
        out.append(dict(
            temperature=float(f[0]), top_p=float(f[1]), min_p=float(f[2]),
            repetition_penalty=float(f[3]), presence_penalty=float(f[4]),
            frequency_penalty=float(f[5]), seed=int(rec[6:7].view(np.uint64)[0]),
            counter=int(rec[7]), top_k=int(rec[8]),
            num_logprobs=None if rec[9] < 0 else int(rec[9]), logits_row=int(rec[12]),
            entry_ids=ent[a : a + n, 0].copy(), entry_counts=ent[a : a + n, 1].copy(),
            entry_flags=ent[a : a + n, 2].copy()))
    return out


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
