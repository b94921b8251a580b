"""The numpy forward against an independent float64 oracle, and its batch invariance."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import tiny_random_model
from tests.oracle_llama import oracle_logits

GEOMETRIES = {
    "gqa-4/2-hd16": {},
    "mha-2/2": dict(n_heads=2, n_kv_heads=2),
    "gqa-6/2-g3": dict(n_heads=6, n_kv_heads=2, hidden_size=96),
    "smollm-like-9/3-hd64": dict(n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=96, n_layers=1),
}
# f32 arithmetic vs float64: the largest error seen on these fixtures is 4.6e-5 on logits up
# to 85 (a few f32 ulps); the bound is 10x that, far below a wrong-RoPE or wrong-mask error.
ATOL, RTOL = 5e-4, 0.0


def _prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_prefill_matches_float64_oracle(name: str) -> None:
    model = tiny_random_model(seed=3, **GEOMETRIES[name])
    rng = np.random.default_rng(1)
    tokens = _prompt(rng, 70, model.config.vocab_size)
    runner = ModelRunner(model, num_pages=16)
    pages = rng.permutation(16)[:5].tolist()
    batch = build_packed_batch([SegmentSpec("r", tokens, 0, pages, list(range(70)))])
    got = runner.forward(batch)
    want = oracle_logits(model.config, model.weights, tokens)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
    assert np.abs(got - want).max() > 0  # f32 really ran (not a float64 path)


def test_decode_through_shuffled_pages_matches_oracle() -> None:
    model = tiny_random_model(seed=5)
    rng = np.random.default_rng(2)
    tokens = _prompt(rng, 40, model.config.vocab_size)
    runner = ModelRunner(model, num_pages=12)
    pages = rng.permutation(12)[:3].tolist()  # 40 positions need 3 pages, never adjacent
    want = oracle_logits(model.config, model.weights, tokens)
    got = [runner.forward(build_packed_batch([SegmentSpec("r", tokens[:7], 0, pages, [6])]))[0]]
    for p in range(7, 40):
        step = SegmentSpec("r", [tokens[p]], p, pages, [0])
        got.append(runner.forward(build_packed_batch([step]))[0])
    np.testing.assert_allclose(np.stack(got), want[6:], atol=ATOL, rtol=RTOL)


def test_wrong_rope_convention_is_caught_by_the_oracle() -> None:
    """Negative control: swapping Q/K into GGUF order must break agreement with the oracle."""
    from dataclasses import replace

    from crucible.model.weights import permute_llama_qk

    model = tiny_random_model(seed=3)
    bad_layers = tuple(replace(lw, wq=permute_llama_qk(lw.wq, model.config.n_heads),
                               wk=permute_llama_qk(lw.wk, model.config.n_kv_heads))
                       for lw in model.weights.layers)
    bad = replace(model, weights=replace(model.weights, layers=bad_layers))
    tokens = _prompt(np.random.default_rng(1), 30, model.config.vocab_size)
    got = ModelRunner(bad, num_pages=4).forward(
        build_packed_batch([SegmentSpec("r", tokens, 0, [0, 1], list(range(30)))]))
    want = oracle_logits(model.config, model.weights, tokens)
    assert np.abs(got - want).max() > 100 * ATOL


def test_int8_close_to_f32() -> None:
    f32 = tiny_random_model(seed=4, weights="f32")
    i8 = tiny_random_model(seed=4, weights="int8")
    tokens = _prompt(np.random.default_rng(0), 20, f32.config.vocab_size)
    batch = build_packed_batch([SegmentSpec("r", tokens, 0, [0, 1], [19])])
    a = ModelRunner(f32, num_pages=2).forward(batch)
    b = ModelRunner(i8, num_pages=2).forward(batch)
    assert not np.array_equal(a, b)  # int8 really quantizes
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()


def test_a_step_past_the_context_is_refused_before_it_runs() -> None:
    model = tiny_random_model(seed=2, max_context=64)
    runner = ModelRunner(model, num_pages=8)
    pages = list(range(5))
    ok = build_packed_batch([SegmentSpec("a", [5], 63, pages, [0])])
    before = runner.forward(ok)
    with pytest.raises(ValueError, match="positions reach 64, past the model's context of 64"):
        runner.forward(build_packed_batch([SegmentSpec("a", [5, 6], 63, pages, [1])]))
    assert np.array_equal(runner.forward(ok).view(np.uint32), before.view(np.uint32))
