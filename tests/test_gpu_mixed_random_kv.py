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
from test_gpu_decode_order import decode_specs, random_kv_runner

pytestmark = pytest.mark.gpu


def mixed_specs(rng: np.random.Generator, vocab: int, rows: int) -> list:
    """A mixed step's segments: ``rows`` decode rows (decode_specs) with a prompt of 37
    tokens from position 0 after the first half and a 21-token slice at 200 after the
    rest, each slice on the next 48 pages."""
    from crucible.step.batch import SegmentSpec

    dec = decode_specs(rng, vocab, rows)
    slices = [SegmentSpec(f"p{j}", rng.integers(0, vocab, n).tolist(), start,
                          list(range(48 * (rows + j), 48 * (rows + j + 1))), [n - 1])
              for j, (start, n) in enumerate(((0, 37), (200, 21)))]
    half = rows // 2
    return dec[:half] + slices[:1] + dec[half:] + slices[1:]


@pytest.mark.parametrize("seed", [3, 8])
def test_mixed_step_bits_hold_eager_replayed_forked(seed: int) -> None:
    from crucible.step.batch import build_packed_batch

    runner = random_kv_runner(seed, 48 * 45)
    batch = build_packed_batch(mixed_specs(np.random.default_rng(seed),
                                           runner.config.vocab_size, 40))
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
    from crucible.step.batch import build_packed_batch

    runner = random_kv_runner(seed, 48 * 45)
    be = runner.backend
    k0, v0 = be.k_pool.copy(), be.v_pool.copy()
    segs = mixed_specs(np.random.default_rng(seed), runner.config.vocab_size, 12)

    def run(specs: list) -> np.ndarray:
        be.k_pool[...] = k0
        be.v_pool[...] = v0
        return runner.forward(build_packed_batch(specs)).view(np.uint32).copy()

    mixed = run(segs)
    for i, s in enumerate(segs):
        for _ in range(2):  # the first sighting and the graph's replay
            alone = run([s])
            assert np.array_equal(alone[-1], mixed[i]), f"{s.request_id} alone differs"
    moved = dataclasses.replace(segs[0], absolute_start=segs[0].absolute_start + 1)
    assert not np.array_equal(run([moved])[-1], mixed[0])
