"""The prefix cache on the GPU (skipped without CuPy and a GPU): warm == cold bit for bit,
through the device sampler, the decode graphs and the pipelined decode, at #17's D7 prefix
lengths (1, 15-17, 31-33, 511, 2048, 4097) and for a fully cached 16-aligned prompt, with a
flush between trials; the negative control spoils a cached page and must change the output."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from crucible import LLM, SamplingParams
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model

pytestmark = pytest.mark.gpu
GEOM = dict(hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_size=512)
# Greedy without and with logprobs, and seeded sampling with them.
PARAMS = [SamplingParams(max_tokens=12, ignore_eos=True, temperature=t, seed=4, logprobs=lp)
          for t, lp in ((0.0, None), (0.0, 2), (0.9, 2))]


def bits(outs) -> list:
    return [(o.token_ids, [[(t, struct.pack("<d", v)) for t, v in lp.items()]
                           for lp in o.logprobs]) for o in outs]


@pytest.fixture(scope="module")
def pair():
    """A cache-off LLM and a cache-on one of the same model, a pool for three 4,102-token
    probes each (the cache's sharing needs fewer)."""
    model = tiny_random_model(seed=9, max_context=8192, **GEOM)
    cold = LLM(model, settings=Settings(device="cuda", num_pages=1200, prefix_cache_size=0))
    warm = LLM(model, settings=Settings(device="cuda", num_pages=1200))
    return model, cold, warm


@pytest.mark.parametrize("prefix", [1, 15, 16, 17, 31, 32, 33, 511, 2048, 4097])
def test_warm_equals_cold_on_the_gpu(pair, prefix: int) -> None:
    model, cold, warm = pair
    warm.engine.prefix_cache.clear()  # a flush between trials
    rng = np.random.default_rng(prefix)
    v = model.config.vocab_size
    shared = rng.integers(0, v, prefix).tolist()
    probes = [shared + rng.integers(0, v, 5).tolist() for _ in range(3)]
    warm.generate([shared + [1, 2]], PARAMS[0])  # fills the cache
    before = warm.engine.cache_stats()["cache_hit_tokens"]
    got = warm.generate(probes, PARAMS)
    assert all(o.num_cached_tokens == prefix // 16 * 16 for o in got)
    assert warm.engine.cache_stats()["cache_hit_tokens"] - before == 3 * (prefix // 16 * 16)
    want = cold.generate(probes, PARAMS)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert bits(got[1:]) == bits(want[1:])
    assert warm.engine.allocator.num_free == warm.engine.allocator.num_pages


def test_fully_cached_aligned_prompt_on_the_gpu(pair) -> None:
    """A prompt whose every page is cached recomputes its last page (the last token's
    logits), and gives the cold run's bits."""
    model, cold, warm = pair
    warm.engine.prefix_cache.clear()
    prompt = np.random.default_rng(5).integers(0, model.config.vocab_size, 2048).tolist()
    first = warm.generate([prompt] * 3, PARAMS)
    again = warm.generate([prompt] * 3, PARAMS)
    assert [o.num_cached_tokens for o in again] == [2032] * 3
    want = cold.generate([prompt] * 3, PARAMS)
    assert bits(again[1:]) == bits(first[1:]) == bits(want[1:])


def test_negative_control_a_spoiled_cached_page_changes_the_output() -> None:
    """The warm run really reads the cached pages: spoil one and its tokens differ (its own
    LLM, so the spoiled pool stays out of the other tests)."""
    model = tiny_random_model(seed=9, max_context=4096, **GEOM)
    warm = LLM(model, settings=Settings(device="cuda", num_pages=256))
    rng = np.random.default_rng(3)
    shared = rng.integers(0, model.config.vocab_size, 300).tolist()
    probe = shared + [7, 8, 9]
    warm.generate([shared + [1, 2]], PARAMS[0])
    base = warm.generate([probe], PARAMS[2:])
    pages = warm.engine.prefix_cache.match(shared + [1], None, [])
    assert len(pages) == 300 // 16
    warm.engine.runner.backend.k_pool[pages[0]] += 5.0
    spoiled = warm.generate([probe], PARAMS[2:])
    assert spoiled[0].num_cached_tokens == base[0].num_cached_tokens == 288
    assert bits(spoiled) != bits(base)
