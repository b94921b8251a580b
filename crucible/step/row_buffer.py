"""The one-buffer upload layout of a step's sampling rows (``RowSampling``).

``pack_rows`` lays every row of a step out in ONE int64 buffer, uploaded with one
host-to-device copy (cuda/sampling.cu reads the same layout):

    words [16 * r, 16 * r + 16): row r's record (f64 fields stored as their bit patterns)
        0 temperature   1 top_p   2 min_p   3 repetition_penalty   4 presence_penalty
        5 frequency_penalty   6 seed (64 bits)   7 counter n (the draw index)
        8 top_k (0: off)   9 num_logprobs (-1: none)   10 first entry   11 entry count
        12 logits row   13..15 zero
    then the entries, two int64 words each, read as four int32: (token id, output count,
    flags, 0) with flags REP, PEN and MASK (``crucible.step.rows``). A token id appears in
    at most one entry, so the device applies each entry with no write conflicts.

``unpack_rows`` reads it back (the numpy twin and tests).
"""

from __future__ import annotations

import math
import struct
from typing import Any, Sequence

import numpy as np

from crucible.step.rows import MASK, MASK64, MAX_LOGPROBS, PEN, REP, RowSampling

ROW_WORDS = 16
ENTRY_WORDS = 2  # int64 words per entry (four int32)
LP_WORDS = 2 * (MAX_LOGPROBS + 1) + 1  # device output per row: count, ids, f64 logprob bits


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
