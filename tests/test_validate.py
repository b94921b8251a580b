"""Host validation: a valid batch passes; each malformed variant is rejected with a clear error."""

from dataclasses import replace

import numpy as np
import pytest

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.validate import validate_packed_batch
from crucible.errors import BatchValidationError

NUM_PAGES, VOCAB = 16, 100


def good():
    # a: prefill of 20 tokens over pages [3, 5]; b: decode at position 40 over [0, 1, 2];
    # c: chunk 8..12 of a prompt over [7] with prompt-logprob rows.
    return build_packed_batch([
        SegmentSpec("a", list(range(20)), 0, [3, 5], [19]),
        SegmentSpec("b", [7], 40, [0, 1, 2], [0]),
        SegmentSpec("c", [1, 2, 3, 4], 8, [7], [0, 1, 3]),
    ])


def check(batch, **kw):
    validate_packed_batch(batch, num_pages=kw.pop("num_pages", NUM_PAGES),
                          vocab_size=VOCAB, **kw)


def with_array(name, fn):
    b = good()
    a = getattr(b, name).copy()
    a = fn(a)
    return replace(b, **{name: a})


def test_good_batch_passes():
    check(good())
    check(good(), max_pages_per_table=3)


def test_shared_read_only_page_is_allowed():
    # Page 9 is in both tables but written by neither (a prefix-cache hit): fine.
    b = build_packed_batch([SegmentSpec("a", [1], 16, [9, 4], [0]),
                            SegmentSpec("b", [2, 3], 20, [9, 6], [1])])
    check(b)


def set_item(index, value):
    def fn(a):
        a[index] = value
        return a
    return fn


CASES = [
    ("token_ids as list", lambda: replace(good(), token_ids=good().token_ids.tolist()), "numpy array"),
    ("token_ids int64", lambda: with_array("token_ids", lambda a: a.astype(np.int64)), "int32"),
    ("positions float", lambda: with_array("positions", lambda a: a.astype(np.float32)), "int32"),
    ("segments 1-D", lambda: with_array("segments", lambda a: a.reshape(-1)), "2-D"),
    ("segments 3 columns", lambda: with_array("segments", lambda a: a[:, :3].copy()), r"\[S, 4\]"),
    ("positions short", lambda: with_array("positions", lambda a: a[:-1].copy()), "rows"),
    ("empty batch", lambda: build_packed_batch([]), "no rows"),
    ("negative packed_start", lambda: with_array("segments", set_item((0, 0), -1)), "negative"),
    ("negative chunk_len", lambda: with_array("segments", set_item((1, 1), -1)), "negative"),
    ("negative absolute_start", lambda: with_array("segments", set_item((1, 2), -5)), "negative"),
    ("zero chunk_len", lambda: with_array("segments", set_item((1, 1), 0)), "empty"),
    ("overflowing start+len", lambda: with_array("segments", set_item((2, 2), 2**31 - 2)), "overflow"),
    ("gap between segments", lambda: with_array("segments", set_item((2, 0), 22)), "tile"),
    ("overlapping segments", lambda: with_array("segments", set_item((1, 0), 19)), "tile"),
    ("segments short of rows", lambda: with_array("segments", set_item((2, 1), 3)), "cover"),
    ("position off by one", lambda: with_array("positions", set_item(5, 6)), "row 5 has position"),
    ("absolute end past table", lambda: with_array("segments", set_item((0, 2), 13)), "past its page table"),
    ("table length too short", lambda: with_array("table_lengths", set_item(1, 2)), "past its page table"),
    ("table length too long", lambda: with_array("table_lengths", set_item(2, 9)), "outside"),
    ("table index out of range", lambda: with_array("segments", set_item((0, 3), 3)), "table_index"),
    ("two segments one table", lambda: with_array("segments", set_item((2, 3), 0)), "share"),
    ("page id too large", lambda: with_array("page_tables", set_item((1, 2), NUM_PAGES)), "outside the pool"),
    ("negative page id", lambda: with_array("page_tables", set_item((0, 0), -1)), "outside the pool"),
    ("page twice in a table", lambda: with_array("page_tables", set_item((1, 1), 0)), "twice"),
    ("written page in another table", lambda: with_array("page_tables", set_item((2, 0), 5)), "writes page 5"),
    ("final row out of range", lambda: with_array("final_rows", set_item(-1, 25)), "out of range"),
    ("negative final row", lambda: with_array("final_rows", set_item(0, -1)), "out of range"),
    ("duplicate final rows", lambda: with_array("final_rows", set_item(2, 20)), "ascending"),
    ("unsorted final rows", lambda: with_array("final_rows", lambda a: a[::-1].copy()), "ascending"),
    ("token id too large", lambda: with_array("token_ids", set_item(3, VOCAB)), "vocabulary"),
    ("negative token id", lambda: with_array("token_ids", set_item(0, -2)), "vocabulary"),
    ("request ids mismatch", lambda: replace(good(), request_ids=("a", "b")), "request ids"),
    ("table_lengths mismatch", lambda: with_array("table_lengths", lambda a: a[:2].copy()), "table lengths"),
]


@pytest.mark.parametrize("name,make,match", CASES, ids=[c[0] for c in CASES])
def test_malformed_batch_rejected(name, make, match):
    with pytest.raises(BatchValidationError, match=match):
        check(make())


def test_too_many_pages_for_limit():
    with pytest.raises(BatchValidationError, match="more than the limit"):
        check(good(), max_pages_per_table=2)


def test_pool_smaller_than_page_ids():
    with pytest.raises(BatchValidationError, match="outside the pool"):
        check(good(), num_pages=7)


# --- Many segments (one per running request): the vectorised checks must accept exactly
# what the segment walk accepts, and report the same first problem.
def _many(n: int = 24):
    return build_packed_batch([SegmentSpec(f"r{i}", [1] * (i % 3 + 1), 10 + i,
                                           [3 * i, 3 * i + 1, 3 * i + 2], [i % 3])
                               for i in range(n)])


def _corrupt(name, fn):
    def make():
        b = _many()
        return replace(b, **{name: fn(getattr(b, name).copy())})
    return make


MANY_CASES = [
    ("negative start", _corrupt("segments", set_item((3, 0), -1))),
    ("gap", _corrupt("segments", set_item((5, 0), 6))),
    ("empty", _corrupt("segments", set_item((7, 1), 0))),
    ("table index", _corrupt("segments", set_item((9, 3), 99))),
    ("shared table", _corrupt("segments", set_item((11, 3), 10))),
    ("table too long", _corrupt("table_lengths", set_item(4, 9))),
    ("past its table", _corrupt("segments", set_item((13, 2), 60))),
    ("page out of pool", _corrupt("page_tables", set_item((6, 1), 999))),
    ("writes a shared page", _corrupt("page_tables", set_item((14, 1), 3 * 15 + 1))),
]


def test_many_segments_pass_both_ways(monkeypatch):
    check(_many(), num_pages=80)
    monkeypatch.setattr("crucible.engine.validate._VECTOR_FROM", 10**9)  # force the walk
    check(_many(), num_pages=80)


@pytest.mark.parametrize("name,make", MANY_CASES, ids=[c[0] for c in MANY_CASES])
def test_many_segments_same_first_error(name, make, monkeypatch):
    with pytest.raises(BatchValidationError) as vectorised:
        check(make(), num_pages=80)
    monkeypatch.setattr("crucible.engine.validate._VECTOR_FROM", 10**9)
    with pytest.raises(BatchValidationError) as walked:
        check(make(), num_pages=80)
    assert str(vectorised.value) == str(walked.value)


# --- Small batches (a decode step of a few requests): a plain-Python pass accepts them
# first. It may only accept what the full checks accept.
def _full(batch, **kw):
    """The full checks alone: True if they accept."""
    import crucible.engine.validate as v

    saved = v.small_ok, v.vector_ok
    v.small_ok = v.vector_ok = lambda *args: False
    try:
        check(batch, **kw)
        return True
    except BatchValidationError:
        return False
    finally:
        v.small_ok, v.vector_ok = saved


def _corruptions(make, rng, n=3000):
    """n batches from make(), each with one random entry of one array moved by a small
    amount: (array name, the corrupted array, the batch)."""
    fields = ("token_ids", "positions", "segments", "page_tables", "table_lengths",
              "final_rows")
    for _ in range(n):
        name = fields[rng.integers(len(fields))]
        a = getattr(make(), name).copy()
        flat = a.reshape(-1)
        flat[rng.integers(flat.size)] += int(rng.choice([-17, -1, 1, 2, 16, 40]))
        yield name, a, replace(make(), **{name: a})


def _small(batch, num_pages=NUM_PAGES, max_pages=None):
    from crucible.engine.validate_fast import small_ok as _small_ok

    return _small_ok(batch, num_pages, VOCAB, max_pages)


def test_small_pass_accepts_good_batches():
    assert _small(good()) and _small(good(), max_pages=3)
    shared = build_packed_batch([SegmentSpec("a", [1], 16, [9, 4], [0]),
                                 SegmentSpec("b", [2, 3], 20, [9, 6], [1])])
    assert _small(shared)


@pytest.mark.parametrize("name,make,match", CASES, ids=[c[0] for c in CASES])
def test_small_pass_refuses_every_malformed_case(name, make, match):
    assert not _small(make())


def test_small_pass_refuses_limits():
    assert not _small(good(), max_pages=2)
    assert not _small(good(), num_pages=7)


def test_small_pass_never_accepts_what_the_full_checks_refuse():
    """3,000 random single-entry corruptions of good batches: wherever the small pass
    accepts, the full checks accept too (and it accepts most unchanged batches)."""
    rng = np.random.default_rng(7)
    accepted = 0
    for name, a, b in _corruptions(good, rng):
        if _small(b):
            accepted += 1
            assert _full(b), (name, a)
    assert accepted > 0  # some corruptions stay valid (a token id within the vocabulary)


# --- The whole-array pass accepts a good batch of any size before the full checks run. It
# may only accept what they accept, and it accepts everything they accept except a page
# held by two tables (which it leaves to them).
def _vector(batch, num_pages, max_pages=None):
    from crucible.engine.validate_fast import vector_ok as _vector_ok

    return _vector_ok(batch, num_pages, VOCAB, max_pages)


def _held_twice(batch) -> bool:
    """Some page sits in two tables (within the tables' stated lengths)."""
    valid = np.arange(batch.page_tables.shape[1])[None, :] < batch.table_lengths[:, None]
    owners = {}
    for t, e in zip(*np.nonzero(valid)):
        owners.setdefault(int(batch.page_tables[t, e]), set()).add(int(t))
    return any(len(ts) > 1 for ts in owners.values())


# The page checks count (np.bincount) or sort depending on the pages' range against their
# number: every test of the whole-array pass runs with each way forced.
@pytest.fixture(params=["count", "sort"])
def page_checks(request, monkeypatch):
    import crucible.engine.validate_fast as vf

    monkeypatch.setattr(vf, "_COUNT_SPAN", 10**9 if request.param == "count" else 0)
    return request.param


def test_vector_pass_accepts_good_batches_and_read_only_sharing(page_checks):
    """Pages several tables hold (the prefix cache's, every step of a chat server) pass the
    whole-array checks as long as no segment writes one and no table holds one twice."""
    assert _vector(_many(), 80) and _vector(good(), NUM_PAGES, 3)
    shared = build_packed_batch([SegmentSpec("a", [1], 16, [9, 4], [0]),
                                 SegmentSpec("b", [2, 3], 20, [9, 6], [1])])
    assert _vector(shared, NUM_PAGES) and _full(shared)
    writes = build_packed_batch([SegmentSpec("a", [1], 16, [9, 4], [0]),  # b writes page 4
                                 SegmentSpec("b", [2, 3], 20, [9, 4], [1])])
    twice = build_packed_batch([SegmentSpec("a", [1], 16, [9, 4], [0]),  # b holds 9 twice
                                SegmentSpec("b", [2, 3], 36, [9, 6, 9], [1])])
    for bad in (writes, twice):
        assert not _vector(bad, NUM_PAGES)
        with pytest.raises(BatchValidationError):
            validate_packed_batch(bad, num_pages=NUM_PAGES, vocab_size=VOCAB)
    assert not _vector(good(), NUM_PAGES, 2) and not _vector(good(), 7)  # limit, pool


@pytest.mark.parametrize("name,make,match", CASES, ids=[c[0] for c in CASES])
def test_vector_pass_refuses_every_malformed_case(name, make, match, page_checks):
    assert not _vector(make(), NUM_PAGES)


@pytest.mark.parametrize("make", [good, _many], ids=["few segments", "many segments"])
def test_vector_pass_agrees_with_the_full_checks(make, page_checks):
    """3,000 random single-entry corruptions: the whole-array pass accepts exactly what the
    full checks accept, pages held by two tables included (some of them are)."""
    rng = np.random.default_rng(11)
    num_pages = 80 if make is _many else NUM_PAGES
    accepted = shared = 0
    for name, a, b in _corruptions(make, rng):
        max_pages = int(rng.choice([2, 3, 4])) if rng.random() < 0.3 else None
        fast = _vector(b, num_pages, max_pages)
        full = _full(b, num_pages=num_pages, max_pages_per_table=max_pages)
        assert fast == full, (name, a, max_pages)
        accepted += fast
        shared += fast and _held_twice(b)
    assert accepted > 0 and shared > 0
