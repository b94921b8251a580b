"""GPU sampler vs the host sampler (skipped without CuPy and a GPU): a reduced gpu-sampling."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.checks.batch_check import Counts

pytestmark = pytest.mark.gpu
VOCAB = 49152


@pytest.fixture(scope="module")
def h():
    from crucible.checks.sampling_check import cupy_harness

    return cupy_harness()


def counts_ok(c: Counts) -> None:
    assert c.failed == 0 and c.passed > 0


def test_rng_bits_equal_host(h) -> None:
    from crucible.checks.sampling_check import check_rng

    c = Counts()
    check_rng(h, c, np.random.default_rng(0), 20_000)
    counts_ok(c)


def test_greedy_and_matrix_equal_sample_row(h) -> None:
    from crucible.checks.sampling_check import check_greedy, check_matrix

    c = Counts()
    rng = np.random.default_rng(1)
    check_greedy(h, c, rng, VOCAB)
    check_matrix(h, c, rng, VOCAB, 64, quick=True)
    counts_ok(c)


def test_large_top_k_small_and_odd_vocabularies(h) -> None:
    from crucible.checks.sampling_check import check_paths

    c = Counts()
    check_paths(h, c, np.random.default_rng(2), VOCAB, quick=True)
    counts_ok(c)


def test_narrowed_draws_equal_sample_row(h) -> None:
    """Flat rows with nothing truncated: the draws past the first 256 candidates are found
    by narrowing (route 32) and equal the host's; tied rows fall back to the sort."""
    from crucible.checks.sampling_check import check_narrow

    c = Counts()
    check_narrow(h, c, np.random.default_rng(4), VOCAB, quick=False)
    counts_ok(c)  # includes "some row was decided by narrowing" on the GPU


def test_batch_invariance(h) -> None:
    from crucible.checks.sampling_check import check_batch

    c = Counts()
    check_batch(h, c, np.random.default_rng(3), VOCAB, [1, 5, 64, 200])
    counts_ok(c)


def test_chi_square_and_other_seeds(h) -> None:
    from crucible.checks.sampling_stats import check_chi2

    c = Counts()
    check_chi2(h, c, np.random.default_rng(4), 4000)
    counts_ok(c)


def test_engine_device_sampling_equals_host_sampling() -> None:
    from crucible.checks.sampling_stats import check_engine
    from crucible.engine.runner import ModelRunner
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=3, n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=192,
                              ffn_size=256)
    c = Counts()
    check_engine(c, lambda ds: ModelRunner(model, num_pages=64, device="cuda",
                                           device_sampling=ds), np.random.default_rng(5))
    counts_ok(c)


def test_bad_input_is_a_clear_error(h) -> None:
    import cupy as cp

    from crucible.step.rows import row_sampling
    from crucible.engine.sampling import SamplingParams

    row = row_sampling(0, SamplingParams(), prompt=[1], output=[], seed=1, stop_ids=(),
                       vocab_size=100)
    for bad in (np.zeros((1, 100), np.float32), cp.zeros((1, 100), cp.float64),
                cp.zeros((100, 2), cp.float32).T, cp.zeros(100, cp.float32)):
        with pytest.raises(ValueError, match="C-contiguous f32 CuPy array"):
            h.sampler.sample(bad, [row])
    with pytest.raises(ValueError, match="logits row outside"):
        h.sampler.sample(cp.zeros((1, 100), cp.float32), [row, row.__class__(
            **{**row.__dict__, "logits_row": 1})])


def test_command_quick() -> None:
    from crucible.checks.sampling_check import main

    assert main(["--quick"]) == 0
