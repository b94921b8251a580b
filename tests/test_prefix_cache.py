"""The prefix cache on the CPU: a hit gives the bits of a cold run, pages are never lost.

D7 cold vs warm over prefix lengths around page edges, D9 churn in a tiny pool with an
invariant check after every step, D10 identity with the engine (its model-free part:
tests/test_prefix_identity.py), concurrency, and the settings. Tokens and
logprobs are compared as bit patterns; each suite has a negative control that must differ.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from crucible import LLM, SamplingParams
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.model.tiny import tiny_random_model

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0, logprobs=2)
SEEDED = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.9, seed=7, logprobs=2)


@pytest.fixture(scope="module")
def model():
    return tiny_random_model(seed=4, max_context=8192)


def llm(model, **kw) -> LLM:
    return LLM(model, settings=Settings(device="cpu", num_pages=kw.pop("num_pages", 1200), **kw))


def bits(outs) -> list:
    """Token ids and every logprob as its f64 bit pattern."""
    return [(o.token_ids, [[(t, struct.pack("<d", v)) for t, v in lp.items()]
                           for lp in o.logprobs]) for o in outs]


def ids(rng, n: int, vocab: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


@pytest.mark.parametrize("prefix", [1, 15, 16, 17, 31, 32, 33, 511, 2048, 4097])
def test_d7_warm_equals_cold(model, prefix: int) -> None:
    rng = np.random.default_rng(prefix)
    v = model.config.vocab_size
    shared = ids(rng, prefix, v)
    fill, probe = shared + ids(rng, 5, v), shared + ids(rng, 9, v)
    cold, warm = llm(model, prefix_cache_size=0), llm(model)
    for params in (GREEDY, SEEDED):
        warm.engine.prefix_cache.clear()  # a flush between trials
        warm.generate([fill], params)  # fills the cache with the shared prefix
        before = warm.engine.cache_stats()["cache_hit_tokens"]
        got = warm.generate([probe], params)
        hit = warm.engine.cache_stats()["cache_hit_tokens"] - before
        assert hit == prefix // 16 * 16 and got[0].num_cached_tokens == hit
        assert bits(got) == bits(cold.generate([probe], params))
    assert warm.engine.allocator.num_free == warm.engine.allocator.num_pages


def test_d7_fully_cached_aligned_prompt_recomputes_its_last_page(model) -> None:
    rng = np.random.default_rng(1)
    prompt = ids(rng, 64, model.config.vocab_size)
    warm, cold = llm(model), llm(model, prefix_cache_size=0)
    first = warm.generate([prompt], SEEDED)
    again = warm.generate([prompt], SEEDED)
    assert again[0].num_cached_tokens == 48  # the page of the last token is computed
    assert bits(again) == bits(first) == bits(cold.generate([prompt], SEEDED))


def test_d7_negative_control_a_corrupted_cached_page_changes_the_output(model) -> None:
    """The warm run really reads the cached pages: spoil one and its tokens differ."""
    rng = np.random.default_rng(2)
    shared = ids(rng, 64, model.config.vocab_size)
    warm = llm(model)
    base = warm.generate([shared + [5, 6]], GREEDY)
    cache = warm.engine.prefix_cache
    pages = cache.match(shared + [1], None, [])
    assert len(pages) == 4
    warm.engine.runner.backend.k_pool[pages[1]] += 3.0
    spoiled = warm.generate([shared + [5, 6]], GREEDY)
    assert spoiled[0].num_cached_tokens == 64 and bits(spoiled) != bits(base)


def check_invariants(engine) -> None:
    alloc, cache = engine.allocator, engine.prefix_cache
    live = [p for r in engine.requests.values() for p in r.page_table.pages]
    assert all(alloc.refcount(p) >= 1 for p in live), "a live table holds a free page"
    assert all(alloc.refcount(p) >= 0 for p in range(alloc.num_pages))
    owned = {p for p in range(alloc.num_pages) if alloc.refcount(p) > 0}
    assert alloc.num_free + len(owned) == alloc.num_pages
    for p in owned:  # owners are exactly the tables that list the page
        assert alloc.refcount(p) == live.count(p)
    cache.check()  # hashed <=> indexed, LRU of unowned pages within the index


def test_d9_churn_in_a_tiny_pool_equals_cold(model) -> None:
    rng = np.random.default_rng(3)
    v = model.config.vocab_size
    heads = [ids(rng, 40, v) for _ in range(3)]
    prompts = [heads[i % 3] + ids(rng, int(rng.integers(1, 20)), v) for i in range(30)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 12)), ignore_eos=True,
                             temperature=0.8, seed=i, logprobs=1) for i in range(30)]
    cold = llm(model, prefix_cache_size=0, num_pages=64)
    warm = llm(model, num_pages=24, max_running=4)  # full eviction, over and over
    eng = warm.engine
    step = eng.step

    def checked_step():
        out = step()
        check_invariants(eng)
        return out

    eng.step = checked_step
    first = warm.generate(prompts, params)
    resend = warm.generate(prompts, params)
    want = bits(cold.generate(prompts, params))
    assert bits(first) == want and bits(resend) == want
    s = eng.cache_stats()
    assert s["cache_hits"] > 0 and s["cache_evictions"] > 0
    assert eng.allocator.num_free == eng.allocator.num_pages


def test_d9_negative_control_the_checker_sees_a_lost_page(model) -> None:
    warm = llm(model, num_pages=24)
    warm.generate([list(range(40))], GREEDY)
    check_invariants(warm.engine)
    alloc = warm.engine.allocator
    page = alloc.allocate(1)[0]  # taken and never given back: a lost page
    with pytest.raises(AssertionError):
        rid = warm.engine.add_request(list(range(20)), GREEDY)
        warm.engine.step()
        check_invariants(warm.engine)
    warm.engine.abort(rid)
    alloc.free([page])


def test_d10_namespace_covers_model_weights_and_arithmetic(model) -> None:
    from crucible.engine.factory import prefix_cache

    other = tiny_random_model(seed=5, max_context=8192)
    be = llm(model).engine.runner.backend
    bases = {prefix_cache(Settings(), m, be, 100).base for m in (model, other)}
    int8 = tiny_random_model(seed=4, max_context=8192, weights="int8")
    bases.add(prefix_cache(Settings(), int8, be, 100).base)
    be.compiled = not be.compiled  # the BLAS-tile path computes other bits
    bases.add(prefix_cache(Settings(), model, be, 100).base)
    be.compiled = not be.compiled
    assert len(bases) == 4


def test_d10_salt_isolates_tenants(model) -> None:
    rng = np.random.default_rng(5)
    shared = ids(rng, 48, model.config.vocab_size)
    warm = llm(model)
    eng = warm.engine

    def hit_tokens(salt):
        rid = eng.add_request(shared + [3], GREEDY, cache_salt=salt)
        while eng.has_unfinished():
            eng.step()
        return eng.requests.get(rid) is None and eng.cache_stats()["cache_hit_tokens"]

    h0 = hit_tokens("tenant-a")
    assert h0 == 0
    assert hit_tokens("tenant-a") == 48  # same salt: hits
    assert hit_tokens("tenant-b") == 48  # other salt: a miss (the count did not move)
    assert hit_tokens(None) == 48


def test_concurrent_sharers_and_an_abort_of_the_filler(model) -> None:
    rng = np.random.default_rng(6)
    v = model.config.vocab_size
    shared = ids(rng, 70, v)
    prompts = [shared + ids(rng, 4, v) for _ in range(6)]
    cold = llm(model, prefix_cache_size=0)
    warm = llm(model)
    eng = warm.engine
    # All in the same step: none can hit (nothing is published yet), all match cold.
    assert bits(warm.generate(prompts, SEEDED)) == bits(cold.generate(prompts, SEEDED))
    eng.prefix_cache.clear()
    # The request filling the prefix is aborted mid-prefill; the others still match cold.
    filler = eng.add_request(shared + [1], SEEDED)
    eng.step()
    eng.abort(filler)
    assert bits(warm.generate(prompts, SEEDED)) == bits(cold.generate(prompts, SEEDED))
    assert eng.allocator.num_free == eng.allocator.num_pages


def test_many_requests_with_shared_system_prompts_equal_cache_off(model) -> None:
    rng = np.random.default_rng(7)
    v = model.config.vocab_size
    systems = [ids(rng, int(rng.integers(20, 90)), v) for _ in range(20)]
    prompts = [systems[int(rng.integers(0, 20))] + ids(rng, int(rng.integers(1, 30)), v)
               for _ in range(1000)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 6)), ignore_eos=True,
                             temperature=float(rng.choice([0.0, 0.8])), seed=i)
              for i in range(1000)]
    warm = llm(model, num_pages=300, max_running=64)
    on = [o.token_ids for o in warm.generate(prompts, params)]
    off = [o.token_ids for o in llm(model, prefix_cache_size=0, num_pages=300,
                                    max_running=64).generate(prompts, params)]
    assert on == off
    assert warm.engine.cache_stats()["cache_hit_tokens"] > 20_000


@pytest.mark.parametrize("raw", ["3", "10%", "-1GiB", "1TB", "1.0000000001GiB", "GiB", "x"])
def test_bad_cache_size_is_one_clear_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="CRUCIBLE_PREFIX_CACHE_SIZE must be a size"):
        Settings.from_env({"CRUCIBLE_PREFIX_CACHE_SIZE": raw})


def test_cache_settings() -> None:
    assert Settings.from_env({"CRUCIBLE_PREFIX_CACHE_SIZE": "0"}).prefix_cache_size == 0
    assert Settings.from_env({"CRUCIBLE_PREFIX_CACHE_SIZE": "auto"}).prefix_cache_size is None
    got = Settings.from_env({"CRUCIBLE_PREFIX_CACHE_SIZE": "3.5GiB"}).prefix_cache_size
    assert got == int(3.5 * (1 << 30))
    assert Settings.from_env({"CRUCIBLE_PREFIX_CACHE_SIZE": "1.5GB"}).prefix_cache_size \
        == 1_500_000_000
    for var in ("CRUCIBLE_PREFIX_CACHE_MAX_TOKENS", "CRUCIBLE_PREFIX_CACHE_ENTRIES"):
        for bad in ("0", "-3", "many", ""):
            with pytest.raises(ConfigError, match=f"{var} must be a whole number >= 1"):
                Settings.from_env({var: bad})


def test_d10_a_change_of_arithmetic_clears_the_cache(model, monkeypatch) -> None:
    """Switching how the backend computes (on the GPU: the attention variant) empties the
    cache before the next step, so no page of the old arithmetic is ever read."""
    rng = np.random.default_rng(8)
    shared = ids(rng, 48, model.config.vocab_size)
    warm = llm(model)
    eng = warm.engine
    warm.generate([shared + [1]], GREEDY)
    assert eng.prefix_cache.num_pages > 0
    same = warm.generate([shared + [2]], GREEDY)
    assert same[0].num_cached_tokens == 48  # the control: unchanged, it hits
    monkeypatch.setattr(type(eng.runner.backend), "arithmetic", property(lambda self: "other"))
    got = warm.generate([shared + [3]], GREEDY)
    assert got[0].num_cached_tokens == 0 and eng.cache_stats()["cache_evictions"] > 0
