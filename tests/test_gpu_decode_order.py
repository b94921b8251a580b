"""The decode graphs' rows listed longest history first (backend/cupy_meta.py; the default,
off with BackendOptions.longest_first) give the bits of the step's own order (skipped
without CuPy and a GPU). The pool holds random K/V, so every history counts. The check also
asserts that the graph replayed and that the two orders really hand the kernel different
lists, so a reorder that silently did nothing cannot pass."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def random_kv_runner(seed: int, pages: int) -> object:
    """A runner of a tiny model with the default model's heads and a context of 768
    positions (48 pages: the histories below reach 700), its pool full of random K/V
    (rows' histories that no prefill wrote, but every one of them read)."""
    import cupy as cp

    from crucible.engine.runner import ModelRunner
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=seed, weights="int8", n_heads=9, n_kv_heads=3,
                              head_dim=64, hidden_size=576, max_context=768)
    runner = ModelRunner(model, num_pages=pages, device="cuda")
    be, gen = runner.backend, cp.random.default_rng(seed)
    be.k_pool[...] = gen.standard_normal(be.k_pool.shape, dtype=cp.float32)
    be.v_pool[...] = gen.standard_normal(be.v_pool.shape, dtype=cp.float32)
    return runner


def decode_specs(rng: np.random.Generator, vocab: int, rows: int) -> list:
    """``rows`` one-row segments at histories 3-700 in random order, 48 pages each (row i
    on pages 48 i ..)."""
    from crucible.step.batch import SegmentSpec

    return [SegmentSpec(f"d{i}", [int(rng.integers(vocab))], int(rng.integers(3, 700)),
                        list(range(48 * i, 48 * (i + 1))), [0]) for i in range(rows)]


def decode_step(rng: np.random.Generator, vocab: int, rows: int = 40) -> object:
    from crucible.step.batch import build_packed_batch

    return build_packed_batch(decode_specs(rng, vocab, rows))


@pytest.mark.parametrize("seed", [3, 8])
def test_longest_first_gives_the_listed_order_bits(seed: int) -> None:
    import dataclasses

    runner = random_kv_runner(seed, 48 * 45)
    batch = decode_step(np.random.default_rng(seed), runner.config.vocab_size)
    be = runner.backend
    g = be.graphs
    assert be.variant.family == "exact" and g is not None
    opts = be.options
    assert opts.longest_first  # the default
    got: dict[bool, list[np.ndarray]] = {}
    metas: dict[bool, bytes] = {}
    for longest in (False, True):
        be.options = dataclasses.replace(opts, longest_first=longest)
        metas[longest] = g.host_meta(batch, 48, g.table_width(2048)).tobytes()
        before = g.num_replays
        got[longest] = [runner.forward(batch).view(np.uint32).copy() for _ in range(4)]
        assert g.num_replays > before
        g.clear()  # the next order captures afresh
    assert metas[False] != metas[True]  # the two orders really differ
    for a, b in zip(got[False], got[True]):
        assert np.array_equal(a, b)
    assert all(np.array_equal(got[True][0], o) for o in got[True])
