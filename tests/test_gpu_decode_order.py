"""Attention's segment lists longest history first (backend/cupy_meta.py; the default, off
with BackendOptions.longest_first: decode rows by history, slices by causal end) give
the bits of the step's own order, in decode-graph and mixed-graph replays and eagerly
(skipped without CuPy and a GPU). Each check also asserts that the graphs replayed and that
the two orders really hand the kernel different lists, so a reorder that silently did
nothing cannot pass."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def runner_and_steps(seed: int) -> tuple:
    """A runner whose pool holds random K/V (every history non-trivial), a decode step of 40
    rows at histories 3-700 in random order, and a mixed step of those rows beside two
    prefill slices."""
    import cupy as cp

    from crucible.engine.runner import ModelRunner
    from crucible.model.tiny import tiny_random_model
    from crucible.step.batch import SegmentSpec, build_packed_batch

    model = tiny_random_model(seed=seed, weights="int8", n_heads=9, n_kv_heads=3,
                              head_dim=64, hidden_size=576)
    runner = ModelRunner(model, num_pages=48 * 45, device="cuda")
    be = runner.backend
    gen = cp.random.default_rng(seed)
    be.k_pool[...] = gen.standard_normal(be.k_pool.shape, dtype=cp.float32)
    be.v_pool[...] = gen.standard_normal(be.v_pool.shape, dtype=cp.float32)
    rng = np.random.default_rng(seed)
    vocab = runner.config.vocab_size
    rows = [SegmentSpec(f"d{i}", [int(rng.integers(vocab))], int(rng.integers(3, 700)),
                        list(range(48 * i, 48 * (i + 1))), [0]) for i in range(40)]
    slices = [SegmentSpec(f"p{j}", rng.integers(0, vocab, n).tolist(), start,
                          list(range(48 * (40 + j), 48 * (41 + j))), [n - 1])
              for j, (start, n) in enumerate(((0, 37), (200, 21)))]
    mixed = rows[:20] + slices[:1] + rows[20:] + slices[1:]
    return runner, build_packed_batch(rows), build_packed_batch(mixed)


def replayed(runner, batch, graphs) -> list[np.ndarray]:
    """Four forwards: the first sightings may run eagerly, the rest replay the graph."""
    before = graphs.num_replays
    got = [runner.forward(batch).view(np.uint32).copy() for _ in range(4)]
    assert graphs.num_replays > before  # captured on a sighting, then replayed
    return got


@pytest.mark.parametrize("seed", [3, 8])
def test_longest_first_gives_the_listed_order_bits(seed: int) -> None:
    import dataclasses

    runner, decode, mixed = runner_and_steps(seed)
    be = runner.backend
    assert be.variant.family == "exact" and be.graphs is not None and be.mixed_graphs
    got: dict[bool, list[np.ndarray]] = {}
    metas: dict[bool, tuple[bytes, bytes]] = {}
    opts = be.options
    assert opts.longest_first  # the default
    for longest in (False, True):
        be.options = dataclasses.replace(opts, longest_first=longest)
        key = be.mixed_graphs.key(mixed)
        metas[longest] = (be.graphs.host_meta(decode, 48, be.graphs.table_width(2048))
                          .tobytes(), be.mixed_graphs.host_meta(mixed, key).tobytes())
        got[longest] = (replayed(runner, decode, be.graphs)
                        + replayed(runner, mixed, be.mixed_graphs))
        be.graphs.clear()  # the next order starts eager again, then captures afresh
        be.mixed_graphs.clear()
    for i in (0, 1):  # the two orders really differ, in both graph kinds
        assert metas[False][i] != metas[True][i]
    for a, b in zip(got[False], got[True]):
        assert np.array_equal(a, b)
    for outs in got.values():  # eager sightings and replays agree within each order
        assert all(np.array_equal(outs[0], o) for o in outs[:4])
        assert all(np.array_equal(outs[4], o) for o in outs[4:])
