"""Requests behind a prefix that another running request is computing wait for its pages
(engine/filling.py) instead of computing them again. Outputs must equal the cache-off run
bit for bit whatever happens to the request filling the prefix (finished, aborted,
preempted, its pages refused by a full cache), no waiter may wait forever, and every page
must come back. Tiny random model on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from crucible import SamplingParams
from crucible.engine.filling import MIN_RUN
from crucible.engine.request import RequestStatus
from crucible.model.tiny import tiny_random_model
from test_prefix_cache import bits, llm

SEEDED = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.9, seed=3, logprobs=2)


@pytest.fixture(scope="module")
def model():
    return tiny_random_model(seed=5, max_context=4096)


def burst(model, n: int = 8, prefix: int = 600, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    v = model.config.vocab_size
    shared = rng.integers(0, v, prefix).tolist()
    return [shared + rng.integers(0, v, int(rng.integers(3, 20))).tolist() for _ in range(n)]


def test_a_burst_behind_a_new_prefix_computes_it_once(model) -> None:
    prompts = burst(model)
    cold = bits(llm(model, prefix_cache_size=0, token_budget=256).generate(prompts, SEEDED))
    warm = llm(model, token_budget=256)
    assert bits(warm.generate(prompts, SEEDED)) == cold
    eng = warm.engine
    # 600 shared tokens are 37 full pages: every request after the first maps all of them
    assert eng.cache_stats()["cache_hit_tokens"] == 7 * 37 * 16
    assert eng.scheduler.filling.num_waits >= 7
    assert len(eng.scheduler.filling) == 0  # every claim ended with its owner
    assert eng.allocator.num_free == eng.allocator.num_pages
    # The negative control: without the waits the same burst computes part of the prefix
    # again (a request admitted beside the first one's last slice, before its pages are
    # published; with pipelined steps, as on a GPU, for two steps instead of one).
    plain = llm(model, token_budget=256)
    plain.engine.scheduler.filling = None
    assert bits(plain.generate(prompts, SEEDED)) == cold
    assert plain.engine.num_rows > eng.num_rows
    assert plain.engine.cache_stats()["cache_hit_tokens"] < 7 * 37 * 16


def test_waiters_let_the_requests_behind_them_in(model) -> None:
    """A request waiting for a prefix does not hold up an unrelated one queued after it."""
    warm = llm(model, token_budget=128, chunk_cap=64)  # a filler leaves room to admit
    eng = warm.engine
    a, b = burst(model, n=2)
    other = np.random.default_rng(9).integers(0, model.config.vocab_size, 40).tolist()
    ra, rb, ro = (eng.add_request(p, SEEDED) for p in (a, b, other))
    eng.step()  # a is admitted; b waits for a's pages; other is admitted past b
    req = eng.requests
    assert req[rb].status is RequestStatus.WAITING and req[rb].waits_on[0] is req[ra]
    assert req[ro].status is RequestStatus.RUNNING
    while eng.has_unfinished():
        eng.step()
    assert eng.allocator.num_free == eng.allocator.num_pages


@pytest.mark.parametrize("end", ["abort", "preempt"])
def test_the_filler_leaving_mid_prefill_frees_its_waiters(model, end: str) -> None:
    prompts = burst(model, n=4, prefix=900, seed=1)
    cold = bits(llm(model, prefix_cache_size=0).generate(prompts, SEEDED))
    warm = llm(model, token_budget=64, chunk_cap=32)
    eng = warm.engine
    first = eng.add_request(prompts[0], SEEDED)
    eng.step()
    eng.step()
    waiter = eng.add_request(prompts[1], SEEDED)
    eng.step()
    assert eng.requests[waiter].waits_on is not None
    if end == "abort":
        eng.abort(first)
    else:
        eng.scheduler._preempt(eng.requests[first])
    eng.step()  # the waiter goes in (or the preempted filler, readmitted, fills again)
    assert len(eng.scheduler.filling) > 0
    while eng.has_unfinished():
        eng.step()
    assert eng.allocator.num_free == eng.allocator.num_pages
    assert len(eng.scheduler.filling) == 0
    assert bits(warm.generate(prompts, SEEDED)) == cold


def test_a_short_shared_run_does_not_wait(model) -> None:
    """Sharing fewer than MIN_RUN pages with the filler's prompt is not worth a wait."""
    rng = np.random.default_rng(2)
    v = model.config.vocab_size
    head = rng.integers(0, v, 16 * (MIN_RUN - 1)).tolist()
    prompts = [head + rng.integers(0, v, 300).tolist() for _ in range(3)]
    warm = llm(model, token_budget=128)
    cold = bits(llm(model, prefix_cache_size=0).generate(prompts, SEEDED))
    assert bits(warm.generate(prompts, SEEDED)) == cold
    assert warm.engine.scheduler.filling.num_waits == 0


def test_a_full_cache_does_not_hold_waiters(model) -> None:
    """The filler's pages past the cache's budget are refused: its waiters compute them
    themselves as soon as the filler is past them, and the run ends."""
    prompts = burst(model, n=4, prefix=400, seed=4)
    cold = bits(llm(model, prefix_cache_size=0).generate(prompts, SEEDED))
    page_bytes = 2 * model.config.n_layers * 16 * model.config.kv_dim * 4
    warm = llm(model, token_budget=64, chunk_cap=32,
               prefix_cache_size=3 * page_bytes)  # 3 pages resident
    assert bits(warm.generate(prompts, SEEDED)) == cold
    eng = warm.engine
    assert eng.scheduler.filling.num_waits > 0
    assert eng.cache_stats()["cache_hit_tokens"] <= 3 * 3 * 16
    assert eng.allocator.num_free == eng.allocator.num_pages


def test_a_tiny_pool_with_waiters_ends_and_equals_cold(model) -> None:
    """Preemptions of fillers and waiters in a pool that holds two requests at a time."""
    prompts = burst(model, n=6, prefix=300, seed=6)
    cold = bits(llm(model, prefix_cache_size=0).generate(prompts, SEEDED))
    warm = llm(model, token_budget=64, num_pages=2 * (-(-330 // 16)) + 2)
    assert bits(warm.generate(prompts, SEEDED)) == cold
    assert warm.engine.allocator.num_free == warm.engine.allocator.num_pages
