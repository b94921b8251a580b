"""The prefix cache on the CPU: a hit gives the bits of a cold run, pages are never lost.

D7 cold vs warm over prefix lengths around page edges, D9 churn in a tiny pool with an
invariant check after every step, D10 identity, concurrency, and the settings. Tokens and
logprobs are compared as bit patterns; each suite has a negative control that must differ.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from crucible import LLM, SamplingParams
from crucible.engine.prefix_cache import namespace_key, page_key
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


def test_d10_identity() -> None:
    # Length-prefixed: moving a character across a field boundary changes the key.
    assert namespace_key("ab", "c") != namespace_key("a", "bc")
    assert namespace_key("a", "") != namespace_key("a")
    root = namespace_key("m")
    page = list(range(16))
    assert page_key(root, page) == page_key(root, list(page))
    assert page_key(root, page) != page_key(root, page[:15] + [16])
    assert page_key(root, page) != page_key(namespace_key("m2"), page)
    # ids are int32, not bytes: 256 and 1 differ even though one byte of each is 1.
    assert page_key(root, [256] + page[1:]) != page_key(root, [1] + page[1:])
    # The documented encoding itself, whichever way it is packed (lists or numpy ids).
    import xxhash

    want = xxhash.xxh3_128_digest(root + np.asarray(page, dtype="<i4").tobytes())
    assert page_key(root, page) == want == page_key(root, np.asarray(page, np.int64))


def test_a_request_whose_chain_is_filled_still_hits() -> None:
    """A request's keys are filled before its admission in two ways: publishing, before a
    preemption sends it back to the queue, and an admission that found no free pages (the
    next step matches it again). Either way the walk starts at the root: the same pages as
    a fresh chain (a match that began at the chain's last key found nothing)."""
    from crucible.engine.prefix_cache import PrefixCache

    cache = PrefixCache(("test", "model", "int8"), "arith", max_pages=64)
    toks = list(range(100, 100 + 16 * 5 + 3))
    published: list[bytes] = []
    for i in range(5):
        cache.publish(10 + i, i, toks[i * 16 : (i + 1) * 16], None, published)
    fresh: list[bytes] = []
    want = [10, 11, 12, 13, 14]
    assert cache.match(toks, None, fresh) == want and fresh == published
    assert cache.match(toks, None, list(published)) == want  # back from a preemption
    assert cache.match(toks, None, fresh) == want  # matched again after a blocked admission
    assert cache.match(toks, None, published[:2]) == want  # a chain published in part
    # Control: a chain whose keys are not this prompt's finds nothing, however it is held.
    other = toks[:16] + [7] * 16 + toks[32:]
    assert cache.match(other, None, []) == [10]
    assert cache.match(other, None, published[:1]) == [10]


def test_a_hash_collision_is_caught_by_the_stored_ids(monkeypatch) -> None:
    """A hit needs the page's ids and parent, not only its key: with a forged hash under
    which every page of a chain collides, another prompt's page is never a hit, and the
    chain's own pages still are (those the collisions let in: the first; later ones share
    its key, so they are not indexed)."""
    import crucible.engine.prefix_cache as pcm

    cache = pcm.PrefixCache(("test", "model", "int8"), "arith", max_pages=64)
    toks = list(range(300, 300 + 16 * 6 + 1))
    chain: list[bytes] = []
    monkeypatch.setattr(pcm.xxhash, "xxh3_128_digest", lambda data: b"k" * 16)
    for i in range(6):
        cache.publish(20 + i, i, toks[i * 16 : (i + 1) * 16], None, chain)
    cache.check()
    assert cache.num_pages == 1 and cache.match(toks, None, []) == [20]
    for bad in range(16):  # one id of the first page changed: same key, other content
        other = list(toks)
        other[bad] += 1
        assert cache.match(other, None, []) == []
    # A page's own ids under another parent are another page (the walk's parent check).
    assert cache.match(toks[16:], None, []) == []


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
