"""Device-sampling metadata (CPU): RowSampling from a request, the one-buffer packing, errors.

The numpy twin samples from what it reads back out of the packed buffer, so "twin == host
sample_row" over random requests proves the packing keeps every field the sampler uses.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from crucible.step.row_buffer import ROW_WORDS, pack_rows, unpack_rows
from crucible.step.rows import (MASK, MASK64, PEN, REP, RowSampling, plain_row_sampling,
                                row_sampling)
from crucible.engine.sampling import SamplingParams, sample_row
from sampler_twin import NumpyTwinSampler

VOCAB = 300


def rs(params: SamplingParams, prompt=(1, 2, 2, 5), output=(5, 7, 7, 7), stop=(7, 9, 400),
       seed=-3, row=0):
    return row_sampling(row, params, prompt=list(prompt), output=list(output), seed=seed,
                        stop_ids=stop, vocab_size=VOCAB)


def entries(r):
    return {int(t): (int(c), int(f)) for t, c, f in zip(r.entry_ids, r.entry_counts,
                                                        r.entry_flags)}


def test_no_penalties_no_entries():
    r = rs(SamplingParams())
    assert r.entry_ids.size == 0 and r.counter == 4 and r.top_k == 0
    assert r.seed == 2**64 - 3 and r.num_logprobs is None and not r.greedy


def test_entries_follow_the_host_penalty_rules():
    assert entries(rs(SamplingParams(repetition_penalty=1.2))) == {
        1: (0, REP), 2: (0, REP), 5: (0, REP), 7: (0, REP)}
    assert entries(rs(SamplingParams(presence_penalty=0.5))) == {5: (1, PEN), 7: (3, PEN)}
    assert entries(rs(SamplingParams(frequency_penalty=-0.5, repetition_penalty=0.9))) == {
        1: (0, REP), 2: (0, REP), 5: (1, REP | PEN), 7: (3, REP | PEN)}
    # min_tokens masks in-vocabulary stop ids only while fewer tokens were generated
    assert entries(rs(SamplingParams(max_tokens=9, min_tokens=5))) == {7: (0, MASK), 9: (0, MASK)}
    assert entries(rs(SamplingParams(max_tokens=9, min_tokens=4))) == {}
    assert entries(rs(SamplingParams(presence_penalty=1.0), output=())) == {}  # no output yet


def test_pack_layout_and_round_trip():
    a = rs(SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, logprobs=5,
                          repetition_penalty=1.3, presence_penalty=0.2, max_tokens=9,
                          min_tokens=6), row=2)
    b = rs(SamplingParams(temperature=0.0), seed=2**64 - 1, row=0, output=())
    buf = pack_rows([a, b], num_logits_rows=3, vocab_size=VOCAB)
    assert buf.dtype == np.int64 and buf.size == 2 * ROW_WORDS + 2 * a.entry_ids.size
    assert buf[:6].view(np.float64).tolist() == [0.7, 0.9, 0.05, 1.3, 0.2, 0.0]
    assert buf[6] == -3 and buf[7:13].tolist() == [4, 40, 5, 0, 5, 2]
    assert buf[ROW_WORDS + 6] == -1 and buf[ROW_WORDS + 9] == -1  # seed bits, no logprobs
    back = unpack_rows(buf, 2)
    for row, d in zip((a, b), back):
        for f in dataclasses.fields(row):
            want, got = getattr(row, f.name), d[f.name]
            assert (np.array_equal(want, got) if isinstance(want, np.ndarray) else want == got), \
                f.name


@pytest.mark.parametrize("change, msg", [
    (dict(logits_row=3), "logits row outside"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(num_logprobs=21), "num_logprobs"),
    (dict(counter=-1), "counter"),
    (dict(entry_ids=np.array([5, 5], np.int32), entry_counts=np.zeros(2, np.int32),
          entry_flags=np.ones(2, np.int32)), "distinct and ascending"),
    (dict(entry_ids=np.array([VOCAB], np.int32), entry_counts=np.zeros(1, np.int32),
          entry_flags=np.ones(1, np.int32)), "outside the vocabulary"),
    (dict(entry_ids=np.array([1], np.int32), entry_counts=np.zeros(1, np.int32),
          entry_flags=np.array([8], np.int32)), "flags"),
    (dict(entry_counts=np.zeros(3, np.int32)), "differ in length"),
])
def test_bad_rows_are_clear_errors(change, msg):
    good = rs(SamplingParams(repetition_penalty=1.1))
    with pytest.raises(ValueError, match=msg):
        pack_rows([dataclasses.replace(good, **change)], num_logits_rows=3, vocab_size=VOCAB)


def test_empty_step_and_bad_history_are_errors():
    with pytest.raises(ValueError, match="no rows"):
        pack_rows([], 1, VOCAB)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        rs(SamplingParams(repetition_penalty=1.1), prompt=(VOCAB,))


def random_request(rng: np.random.Generator):
    kw = dict(temperature=float(rng.choice([0.0, 0.5, 1.0, 1.5])),
              top_k=[None, 1, 3, 50][rng.integers(4)], top_p=float(rng.choice([0.3, 0.9, 1.0])),
              min_p=float(rng.choice([0.0, 0.1])), logprobs=[None, 0, 4][rng.integers(3)])
    if rng.random() < 0.5:
        kw.update(repetition_penalty=float(rng.choice([0.8, 1.4])),
                  presence_penalty=float(rng.uniform(-1, 1)),
                  frequency_penalty=float(rng.uniform(-1, 1)))
    output = rng.integers(0, 20, int(rng.integers(0, 8))).tolist()  # small ids: repeats
    kw.update(max_tokens=len(output) + 3, min_tokens=int(rng.integers(0, len(output) + 3)))
    prompt = rng.integers(0, VOCAB, int(rng.integers(1, 30))).tolist()
    stop = tuple(int(t) for t in rng.integers(0, VOCAB + 10, 3))
    return SamplingParams(**kw), prompt, output, stop, int(rng.integers(-2**63, 2**63))


def test_twin_through_the_packed_buffer_equals_sample_row():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((8, VOCAB)) * 2).astype(np.float32)
    logits[3, :40] = 1.5  # ties at the top
    reqs = [random_request(rng) for _ in range(400)]
    rows = [row_sampling(i % 8, p, prompt=pr, output=o, seed=s, stop_ids=st, vocab_size=VOCAB)
            for i, (p, pr, o, st, s) in enumerate(reqs)]
    got = NumpyTwinSampler().sample(logits, rows)
    for i, (p, pr, o, st, s) in enumerate(reqs):
        want = sample_row(logits[i % 8], p, prompt=pr, output=o, seed=s, stop_ids=st)
        assert (got.token_ids[i], got.logprobs[i]) == (want.token_id, want.logprobs), i


def test_plain_rows_need_no_history():
    """plain_row_sampling (the engine's per-step fast path) gives exactly the record of the
    general rule when a row has no penalty and min_tokens is met, and None otherwise."""
    rng = np.random.default_rng(3)
    plain_seen = 0
    for i in range(400):
        p, prompt, output, stop, seed = random_request(rng)
        got = plain_row_sampling(i % 8, p, num_output=len(output), seed=seed)
        plain = (p.repetition_penalty == 1.0 and p.presence_penalty == 0
                 and p.frequency_penalty == 0 and len(output) >= p.min_tokens)
        assert (got is not None) == plain, i
        if got is None:
            continue
        plain_seen += 1
        # The general rule: parameters as plain numbers, no entries.
        none = np.zeros(0, np.int32)
        want = RowSampling(logits_row=i % 8, temperature=float(p.temperature),
                           top_k=int(p.top_k or 0), top_p=float(p.top_p), min_p=float(p.min_p),
                           repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                           seed=seed & MASK64, counter=len(output), num_logprobs=p.logprobs,
                           entry_ids=none, entry_counts=none, entry_flags=none)
        full = row_sampling(i % 8, p, prompt=prompt, output=output, seed=seed, stop_ids=stop,
                            vocab_size=VOCAB)
        for f in dataclasses.fields(RowSampling):
            for other in (want, full):
                a, b = getattr(got, f.name), getattr(other, f.name)
                if isinstance(a, np.ndarray):
                    assert a.dtype == b.dtype and np.array_equal(a, b), (i, f.name)
                else:
                    assert type(a) is type(b) and a == b, (i, f.name)
    assert plain_seen > 50


def test_record_packing_equals_the_columnar_layout():
    """Steps whose rows carry no entries are packed record by record (struct); the words
    equal the columnar numpy path's for random rows (temperatures, top-k/p, min-p, seeds up
    to 2^64 - 1, counters, logprobs)."""
    from crucible.step.row_buffer import _pack_columnar, _pack_records

    rng = np.random.default_rng(11)
    for n in (1, 2, 7, 64):
        rows = []
        for i in range(n):
            params = SamplingParams(temperature=float(rng.choice([0.0, 0.7, 1.3])),
                                    top_k=int(rng.integers(0, 500)),
                                    top_p=float(rng.uniform(0.05, 1.0)),
                                    min_p=float(rng.uniform(0.0, 0.5)),
                                    logprobs=None if i % 3 else int(rng.integers(0, 6)))
            seed = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
            rows.append(row_sampling(n - 1 - i, params, prompt=[1, 2], output=[3] * (i % 4),
                                     seed=seed, stop_ids=(), vocab_size=VOCAB))
        assert all(r.entry_ids.size == 0 for r in rows)
        got = _pack_records(rows)
        assert got.dtype == np.int64 and got.flags.writeable
        assert np.array_equal(got, _pack_columnar(rows, VOCAB))
        assert np.array_equal(pack_rows(rows, n, VOCAB), got)
