"""A mixed step's two attention launches on two streams (crucible/backend/cupy_fork.py) give
the bits of the one-stream order, eagerly and replayed from a mixed graph (skipped without
CuPy and a GPU). Each check also asserts the fork was taken at every layer, so a fork
that silently fell back to one stream cannot pass."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def mixed_step(seed: int) -> tuple:
    """A runner whose pool holds the histories, and a step of decode rows at 77-500
    positions beside two prefill slices (odd sizes, one starting mid-prompt)."""
    from crucible.engine.runner import ModelRunner
    from crucible.model.tiny import tiny_random_model
    from crucible.step.batch import SegmentSpec, build_packed_batch

    model = tiny_random_model(seed=seed, weights="int8", n_heads=9, n_kv_heads=3,
                              head_dim=64, hidden_size=576)
    runner = ModelRunner(model, num_pages=400, device="cuda")
    rng = np.random.default_rng(seed)
    vocab, specs, page = runner.config.vocab_size, [], 0
    for i, (start, n) in enumerate(((301, 1), (0, 37), (77, 1), (16, 21), (500, 1), (9, 1),
                                    (260, 1))):
        tok = rng.integers(0, vocab, n).tolist()
        specs.append(SegmentSpec(f"r{i}", tok, start, list(range(page, page + 32)), [n - 1]))
        page += 32
    for s in specs:  # every row's earlier positions hold K/V of a prefill of its own
        if s.absolute_start:
            hist = rng.integers(0, vocab, s.absolute_start).tolist()
            runner.forward(build_packed_batch([SegmentSpec("h", hist, 0, s.pages, [])]))
    batch = build_packed_batch(specs)
    assert runner.backend.prepare(batch).mixed is not None  # both kinds of segment
    return runner, batch


@pytest.mark.parametrize("seed", [2, 7])
def test_forked_attention_equals_one_stream(seed: int) -> None:
    import dataclasses

    runner, batch = mixed_step(seed)
    be, layers = runner.backend, runner.config.n_layers
    mg = be.mixed_graphs
    assert mg is not None
    opts = be.options
    assert opts.attention_fork  # the default

    def forks() -> int:  # the backend's Fork may exist already: start-up captures fork
        fork = be.__dict__.get("_fork")
        return 0 if fork is None else fork.forks

    be.options = dataclasses.replace(opts, attention_fork=False)
    mg.clear()  # no graph captured with the fork on may answer
    n = forks()
    plain = runner.forward(batch).view(np.uint32)  # one stream (eager or a fresh capture)
    assert forks() == n
    mg.clear()
    be.options = opts
    eager = runner.forward(batch).view(np.uint32)  # forked (eager, or a capture's warm-up)
    assert forks() >= n + layers
    replays = mg.num_replays
    graphed = [runner.forward(batch).view(np.uint32) for _ in range(3)]  # captured, replayed
    assert mg.num_replays > replays
    assert forks() > n + layers  # the capture's warm-up and capture forked too
    assert np.array_equal(eager, plain)
    for got in graphed:
        assert np.array_equal(got, plain)
