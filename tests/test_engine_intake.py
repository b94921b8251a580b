"""LLMEngine.add_request's intake of prompt ids: a conversation-long prompt is checked with
two C scans (min, max), and only a failing one is walked, so the error still names the
first bad id in prompt order; ids of any integer kind become Python ints. A caller that
checked the request already (the async engine's ``add``, ``LLM.generate``) passes
``checked=True`` and the scan is not run twice."""

from __future__ import annotations

import re

import numpy as np
import pytest

from crucible.api import LLM
from crucible.engine.request import TokenIds
from crucible.engine.sampling import SamplingParams
from crucible.engine.settings import Settings
from crucible.errors import RequestError
from crucible.model.tiny import tiny_random_model


@pytest.fixture(scope="module")
def engine():  # noqa: ANN201
    llm = LLM(tiny_random_model(seed=0), settings=Settings(device="cpu", num_pages=256))
    return llm.engine


@pytest.mark.parametrize(("ids", "first_bad"), [
    ([5, 999, -1, 7], 999),  # the first in order, not the smallest or the largest
    ([5, -1, 999], -1),
    ([271, 272], 272),  # the vocabulary's edge
])
def test_the_error_names_the_first_bad_id(engine, ids: list[int],  # noqa: ANN001
                                          first_bad: int) -> None:
    vocab = engine.vocab_size
    with pytest.raises(RequestError, match=rf"prompt token id {first_bad} is outside the "
                                           rf"vocabulary \[0, {vocab}\)"):
        engine.add_request(ids, SamplingParams(max_tokens=1))
    assert not engine.scheduler.waiting  # nothing was queued


def test_ids_of_any_integer_kind_become_python_ints(engine) -> None:  # noqa: ANN001
    prompt = np.arange(3, 300, dtype=np.int64) % engine.vocab_size
    rid = engine.add_request(prompt, SamplingParams(max_tokens=1))
    req = engine.requests[rid]
    assert req.token_ids == [int(t) for t in prompt]
    assert all(type(t) is int for t in req.token_ids)
    engine.abort(rid)


def test_ids_that_are_not_numbers_are_refused(engine) -> None:  # noqa: ANN001
    with pytest.raises(ValueError):
        engine.add_request([1, "x", 2], SamplingParams(max_tokens=1))
    assert not engine.scheduler.waiting


def test_the_vocabulary_edges_are_accepted(engine) -> None:  # noqa: ANN001
    rid = engine.add_request([0, engine.vocab_size - 1, 0], SamplingParams(max_tokens=1))
    assert engine.requests[rid].token_ids == [0, engine.vocab_size - 1, 0]
    engine.abort(rid)


def test_our_own_lists_of_ints_are_taken_as_they_are(engine) -> None:  # noqa: ANN001
    """The async engine's ``add`` and the engine process's loop build the ids as
    ``TokenIds`` (Python ints already): add_request takes that list without converting it,
    still checking it; any other list, even of ints, is converted (a copy)."""
    from crucible.engine import core_wire as wire
    from crucible.engine.request import TokenIds

    ids = TokenIds(range(3, 200))
    rid = engine.add_request(ids, SamplingParams(max_tokens=1))
    assert engine.requests[rid].token_ids == list(range(3, 200))
    engine.abort(rid)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.add_request(TokenIds([1, engine.vocab_size]), SamplingParams(max_tokens=1))
    frame = wire.encode_add(7, "r", np.arange(5, 60), SamplingParams(max_tokens=1),
                            final_only=False, cache_salt=None, use_prefix_cache=True)
    _, decoded, _ = wire.decode_add(frame)  # checked as an array; the loop makes the list
    assert decoded.dtype == np.int32 and decoded.tolist() == list(range(5, 60))
    # np.int64 in a TokenIds would be a bug of ours: the plain path is the one that converts.
    rid = engine.add_request([np.int64(4), 5], SamplingParams(max_tokens=1))
    assert all(type(t) is int for t in engine.requests[rid].token_ids)
    engine.abort(rid)


def test_a_checked_request_is_not_checked_again(engine, monkeypatch) -> None:  # noqa: ANN001
    """``checked=True``: the caller ran check_request (the async engine's ``add``,
    ``LLM.generate``), so add_request does not scan the ids a second time."""
    calls = []
    real = type(engine).check_request
    monkeypatch.setattr(type(engine), "check_request",
                        lambda self, ids, p: (calls.append(len(ids)), real(self, ids, p))[1])
    rid = engine.add_request(list(range(3, 40)), SamplingParams(max_tokens=1), checked=True)
    assert calls == []
    engine.abort(rid)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.add_request([1, engine.vocab_size], SamplingParams(max_tokens=1))
    assert calls == [2]  # unchecked by default


def test_the_async_engine_and_generate_check_each_request_once(monkeypatch) -> None:
    import asyncio

    llm = LLM(tiny_random_model(seed=0), settings=Settings(device="cpu", num_pages=256))
    calls = []
    real = type(llm.engine).check_request
    monkeypatch.setattr(type(llm.engine), "check_request",
                        lambda self, ids, p: (calls.append(len(ids)), real(self, ids, p))[1])
    outs = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=2, temperature=0.0))
    assert [len(o.token_ids) for o in outs] == [2, 2] and calls == [3, 2]

    async def run() -> list[int]:
        ae = llm.async_engine()
        got = [t async for d in ae.generate([5, 6, 7, 8], SamplingParams(max_tokens=3))
               for t in d.new_token_ids]
        with pytest.raises(RequestError, match="outside the vocabulary"):
            ae.generate([1, llm.engine.vocab_size], SamplingParams(max_tokens=1))
        await ae.shutdown()
        return got

    calls.clear()
    assert len(asyncio.run(run())) == 3
    assert calls == [4, 2]  # once on arrival each; the worker did not check again


def _old_intake(engine, ids, params):  # noqa: ANN001, ANN202
    """What the async engine's ``add`` did before ``checked_ids``: check the raw ids, then
    convert them one by one."""
    engine.check_request(ids, params)
    return list(map(int, ids))


@pytest.mark.parametrize("ids", [
    list(range(3, 260)), np.arange(3, 260, dtype=np.int32), np.arange(3, 9, dtype=np.uint16),
    [5, 999, -1, 7], np.array([5, -1, 999]), [271, 272], [0, 271], [True, 2], [3.7, 1],
    [-0.5, 3], [2.0, 270.9], ["5", "6"], [2**70, 1], [2**63, 1], [1, "x"], [np.int64(4), 5],
    [[1, 2], [3, 4]], [], [None],
])
def test_checked_ids_accepts_and_refuses_what_the_old_intake_did(engine, ids) -> None:  # noqa: ANN001
    """The integer-array path and the general one give the same ids, or the same error
    naming the same id, as checking the raw ids and converting each (the async engine's
    intake before): floats, strings, bools and ints past int64 take the general path."""
    params = SamplingParams(max_tokens=1)
    try:
        want = _old_intake(engine, ids, params)
    except Exception as e:  # noqa: BLE001 - the same kind and message expected
        with pytest.raises(type(e), match=re.escape(str(e))):
            engine.checked_ids(ids, params)
        return
    got = engine.checked_ids(ids, params)
    assert type(got) is TokenIds and got == want and all(type(t) is int for t in got)
