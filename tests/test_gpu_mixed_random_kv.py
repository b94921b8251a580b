"""A mixed step over histories of random K/V gives one set of bits however it runs: eagerly
or replayed from its graph, its two attention launches forked or on one stream, again and
again (skipped without CuPy and a GPU). Histories that the model's own prefills wrote (the
other mixed-step tests) keep scores and values in the model's range; random ones reach
further, and every history position is read. And each of its segments run alone gives
its rows' bits (batch invariance, the numerics contract)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_gpu_decode_order import random_kv_runner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seed", [3, 8])
def test_mixed_step_bits_hold_eager_replayed_forked(seed: int) -> None:
    from crucible.step.batch import SegmentSpec, build_packed_batch

    runner = random_kv_runner(seed, 48 * 45)
    rng = np.random.default_rng(seed)
    vocab = runner.config.vocab_size
    dec = [SegmentSpec(f"d{i}", [int(rng.integers(vocab))], int(rng.integers(3, 700)),
                       list(range(48 * i, 48 * (i + 1))), [0]) for i in range(40)]
    slices = [SegmentSpec(f"p{j}", rng.integers(0, vocab, n).tolist(), start,
                          list(range(48 * (40 + j), 48 * (41 + j))), [n - 1])
              for j, (start, n) in enumerate(((0, 37), (200, 21)))]
    batch = build_packed_batch(dec[:20] + slices[:1] + dec[20:] + slices[1:])
    be = runner.backend
    mg, opts = be.mixed_graphs, be.options
    assert mg is not None and be.prepare(batch).mixed is not None
    outs = []
    for fork in (True, False):
        be.options = dataclasses.replace(opts, attention_fork=fork)
        for graphs in (True, False):
            mg.clear()  # eager first sightings, then a capture and replays
            be.mixed_graphs = mg if graphs else None
            try:
                before = mg.num_replays
                outs += [runner.forward(batch).view(np.uint32).copy() for _ in range(4)]
                assert (mg.num_replays > before) == graphs
            finally:
                be.mixed_graphs = mg
    be.options = opts
    for i, o in enumerate(outs):
        bad = np.nonzero((o != outs[0]).any(axis=1))[0]
        assert bad.size == 0, f"forward {i}: final rows {bad.tolist()} differ from the first"


@pytest.mark.parametrize("seed", [3, 8])
def test_each_segment_alone_gives_its_mixed_rows_bits(seed: int) -> None:
    """Batch invariance over random K/V: every decode row run as a one-row step (the batch-1
    stack and its graph) and every slice run alone (a lone prefill) gives the bits of its
    row in the mixed step; the pool is put back before each step, so each reads the same
    histories. Control: a decode row one position later must give other bits."""
    from crucible.step.batch import SegmentSpec, build_packed_batch

    runner = random_kv_runner(seed, 48 * 45)
    be = runner.backend
    k0, v0 = be.k_pool.copy(), be.v_pool.copy()
    rng = np.random.default_rng(seed)
    vocab = runner.config.vocab_size
    dec = [SegmentSpec(f"d{i}", [int(rng.integers(vocab))], int(rng.integers(3, 700)),
                       list(range(48 * i, 48 * (i + 1))), [0]) for i in range(12)]
    slices = [SegmentSpec(f"p{j}", rng.integers(0, vocab, n).tolist(), start,
                          list(range(48 * (12 + j), 48 * (13 + j))), [n - 1])
              for j, (start, n) in enumerate(((0, 37), (200, 21)))]
    segs = dec[:6] + slices[:1] + dec[6:] + slices[1:]

    def run(specs: list) -> np.ndarray:
        be.k_pool[...] = k0
        be.v_pool[...] = v0
        return runner.forward(build_packed_batch(specs)).view(np.uint32).copy()

    mixed = run(segs)
    for i, s in enumerate(segs):
        for _ in range(2):  # the first sighting and the graph's replay
            alone = run([s])
            assert np.array_equal(alone[-1], mixed[i]), f"{s.request_id} alone differs"
    moved = dataclasses.replace(dec[0], absolute_start=dec[0].absolute_start + 1)
    assert not np.array_equal(run([moved])[-1], mixed[0])
