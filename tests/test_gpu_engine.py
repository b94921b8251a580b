"""GPU engine checks (skipped without CuPy and a GPU): the reduced gpu-engine-check."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_linear_kernels_identical_for_every_m() -> None:
    from crucible.checks.engine_check import Tally, check_linear

    t = Tally()
    check_linear(t, np.random.default_rng(0))
    assert t.failed == 0 and t.passed > 0


def test_chunk_kernel_fused_order_and_graphs() -> None:
    """rmsnorm + chunk SwiGLU == the fused row kernel; the partials finished on the host in
    ascending order == the kernel, descending (negative control) != ; graph replays == eager.
    (The chunk kernel == tiled for M = 1..64 runs in check_linear above.)"""
    from crucible.checks.chunks_check import check_chunks
    from crucible.checks.engine_check import Tally

    t = Tally()
    check_chunks(t, np.random.default_rng(3))
    assert t.failed == 0 and t.passed > 0


@pytest.mark.parametrize("name", ["g4-12/3", "g3-9/3"])
def test_tiny_model_exact_and_agreeing(name: str) -> None:
    from crucible.checks.engine_check import GEOMS, Tally, check_model

    t = Tally()
    check_model(t, name, GEOMS[name], np.random.default_rng(1), "online-q2-k32")
    assert t.failed == 0 and t.passed > 0


def test_decode_graphs_equal_eager() -> None:
    from crucible.checks.engine_check import GEOMS, Tally, check_graphs

    t = Tally()
    check_graphs(t, "g3-9/3", GEOMS["g3-9/3"], np.random.default_rng(2))
    assert t.failed == 0 and t.passed > 0


def test_mixed_graphs_equal_eager() -> None:
    """Mixed steps replayed from padded graphs == the same steps eagerly, every row bitwise,
    and every qualifying step a replay (gpu-graph-check's mixed part on the tiny model)."""
    from crucible.checks.graph_check import check_mixed, make_pair
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=3, weights="int8", n_heads=9, n_kv_heads=3, head_dim=64,
                              hidden_size=576)
    cand, ref = make_pair(model, "cuda", 2000)
    passed, failed = check_mixed(cand, ref, 30, 100, seed=1)
    assert failed == 0 and passed > 0 and cand.backend.mixed_graphs.num_replays > 0


@pytest.mark.parametrize("gemm,rows", [("fma", 512), ("mma", 512), ("mma", 1024)])
def test_long_mixed_graphs_equal_eager(gemm: str, rows: int) -> None:
    """Mixed steps with decode histories past 1,024 beside short slices: replays (the
    slices' score capacity below the decode rows') == eager, bitwise, every step a replay."""
    from crucible.checks.graph_check import make_pair
    from crucible.checks.mixed_long_check import check_mixed_long
    from crucible.engine.settings import Settings
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=3, weights="int8", n_heads=9, n_kv_heads=3, head_dim=64,
                              hidden_size=576)
    passed, failed = check_mixed_long(model, "cuda", Settings(gemm=gemm, mixed_graph_rows=rows),
                                      6, 2, make_pair)
    assert failed == 0 and passed > 0


@pytest.mark.parametrize("weights,gemm", [("f32", "fma"), ("int8", "fma"), ("int8", "mma")])
def test_decode_stack_equals_layers(weights: str, gemm: str) -> None:
    """The batch-1 decode stack == the five-kernel layers, per kernel (with the descending
    O-partials negative control, which must differ) and per step, eager and from graphs;
    under mma its MMA forms == the mma order's stages, and the fma forms must differ."""
    from crucible.checks.engine_check import GEOMS, Tally
    from crucible.checks.stack_check import check_stack_stages, check_stack_steps

    t = Tally()
    rng = np.random.default_rng(4)
    check_stack_stages(t, "g3-9/3", GEOMS["g3-9/3"], weights, rng, gemm)
    check_stack_steps(t, "g3-9/3", GEOMS["g3-9/3"], weights, rng, gemm)
    assert t.failed == 0 and t.passed == (9 if gemm == "mma" else 8) * 9 + 2


def test_graph_argmax_equals_the_sampler() -> None:
    """All-greedy requests through a pipelined engine on decode graphs (ids from the graphs'
    argmax, both twins) == an engine without graphs (ids from the sampler's kernel)."""
    from crucible.checks.pipeline_check import check_pipeline
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=1, weights="int8", n_heads=9, n_kv_heads=3, head_dim=64,
                              hidden_size=192, ffn_size=256, tie_embeddings=False,
                              max_context=512)
    same, diff, chained = check_pipeline(model, "cuda", seed=5, requests=12, greedy=True)
    assert (same, diff) == (12, 0) and chained > 0


def test_pipelined_mixed_steps_equal_the_plain_engine() -> None:
    """Late arrivals beside running decodes: mixed steps planned ahead, their decode rows'
    ids read on the device, replaying mixed graphs or (graphs off) run eagerly == the
    engine without pipelining: ids, logprobs, text, reasons; pages back."""
    from crucible.checks.pipeline_check import check_pipeline
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=3, weights="int8", n_heads=9, n_kv_heads=3, head_dim=64,
                              hidden_size=192, ffn_size=256, tie_embeddings=False,
                              max_context=512)
    for how in ("graphs", "eager"):
        same, diff, chained = check_pipeline(model, "cuda", seed=8, requests=16, mixed=how)
        assert (same, diff) == (16, 0) and chained > 0


def test_mixed_step_split_attention_equals_one_launch() -> None:
    """A step of decode rows and prefill slices (odd sizes, so nothing is aligned by luck)
    gives the same logits bits whether its attention runs split (the default: decode kernel
    + tiled kernel) or as one tiled launch over every segment (the split removed)."""
    import dataclasses

    from crucible.engine.runner import ModelRunner
    from crucible.model.tiny import tiny_random_model
    from crucible.step.batch import SegmentSpec, build_packed_batch

    model = tiny_random_model(seed=2, weights="int8", n_heads=9, n_kv_heads=3, head_dim=64,
                               hidden_size=576)
    runner = ModelRunner(model, num_pages=400, device="cuda")
    rng = np.random.default_rng(5)
    vocab, specs, page = runner.config.vocab_size, [], 0
    for i, (start, n) in enumerate(((301, 1), (0, 37), (77, 1), (16, 21), (500, 1), (9, 1))):
        tok = rng.integers(0, vocab, n).tolist()
        # 32 pages: the tiny model's whole context (512), the widest table a graph holds
        specs.append(SegmentSpec(f"r{i}", tok, start, list(range(page, page + 32)), [n - 1]))
        page += 32
    batch = build_packed_batch(specs)
    # Histories: every row's earlier positions hold K/V written by a prefill of its own.
    for s in specs:
        if s.absolute_start:
            hist = rng.integers(0, vocab, s.absolute_start).tolist()
            runner.forward(build_packed_batch([SegmentSpec("h", hist, 0, s.pages, [])]))
    be = runner.backend
    assert be.prepare(batch).mixed is not None
    split = runner.forward(batch)
    prepare = type(be).prepare
    be.prepare = lambda b: dataclasses.replace(prepare(be, b), mixed=None)
    try:
        one = runner.forward(batch)
    finally:
        del be.prepare
    assert split.shape == (6, vocab) and np.isfinite(split).all()
    assert (split.view(np.uint32) == one.view(np.uint32)).all()
