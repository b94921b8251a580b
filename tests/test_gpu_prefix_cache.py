"""The prefix cache on the GPU (skipped without CuPy and a GPU): warm == cold bit for bit,
through the device sampler, the decode graphs and the pipelined decode."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from crucible import LLM, SamplingParams
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model

pytestmark = pytest.mark.gpu
GEOM = dict(hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_size=512)


def bits(outs) -> list:
    return [(o.token_ids, [[(t, struct.pack("<d", v)) for t, v in lp.items()]
                           for lp in o.logprobs]) for o in outs]


@pytest.mark.parametrize("prefix", [17, 33, 300, 1100])
def test_warm_equals_cold_on_the_gpu(prefix: int) -> None:
    model = tiny_random_model(seed=9, max_context=4096, **GEOM)
    rng = np.random.default_rng(prefix)
    v = model.config.vocab_size
    shared = rng.integers(0, v, prefix).tolist()
    probes = [shared + rng.integers(0, v, 5).tolist() for _ in range(3)]
    params = [SamplingParams(max_tokens=12, ignore_eos=True, temperature=t, seed=4, logprobs=l)
              for t, l in ((0.0, None), (0.0, 2), (0.9, 2))]
    cold = LLM(model, settings=Settings(device="cuda", num_pages=512, prefix_cache_size=0))
    warm = LLM(model, settings=Settings(device="cuda", num_pages=512))
    warm.generate([shared + [1, 2]], params[0])  # fills the cache
    got = warm.generate(probes, params)
    assert all(o.num_cached_tokens == prefix // 16 * 16 for o in got)
    want = cold.generate(probes, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert bits(got[1:]) == bits(want[1:])
    # Negative control: a spoiled cached page must change what a warm request computes.
    pages = warm.engine.prefix_cache.match(shared + [1], None, [])
    if pages:
        warm.engine.runner.backend.k_pool[pages[0]] += 5.0
        spoiled = warm.generate(probes[2:], params[2:])
        assert bits(spoiled) != bits(want[2:])
