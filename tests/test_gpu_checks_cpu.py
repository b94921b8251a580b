"""The issue-5 validation commands, run on the numpy backend (the GPU runs them for real).

Each command must pass with exact counts on the tiny model, and each kind of comparison has a
negative control: a realistic bug (batch-dependent rounding, a pool read that assumes
contiguous pages, a graph that rounds differently, a decode path that differs from prefill,
a decode step that was not replayed) must be counted as a failure and exit non-zero.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.backend import cpu_ops, numpy_attention
from crucible.checks import batch_check, graph_check, validate
from crucible.checks.batch_check import Counts, bits_equal
from crucible.engine.runner import ModelRunner

BATCH = ["--device", "cpu", "--sizes", "1", "3", "16", "17", "--steps", "3", "--max-prompt", "40"]
PAGED = ["--device", "cpu", "--requests", "6", "--steps", "2", "--max-prompt", "40"]
GRAPH = ["--device", "cpu", "--sizes", "1", "3", "17", "2", "--steps", "3", "--max-prompt", "40"]
DECODE = ["--device", "cpu", "--lengths", "1", "16", "33", "--steps", "2"]


def bump(out: np.ndarray) -> np.ndarray:
    """One ulp on one logit of every row: the smallest difference a bitwise check must see."""
    out = out.copy()
    out[:, 0] = np.nextafter(out[:, 0], np.float32(np.inf))
    return out


def test_bits_equal_and_counts() -> None:
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert bits_equal(a, a.copy())
    assert not bits_equal(a, bump(a))
    assert not bits_equal(np.float32([0.0]), np.float32([-0.0]))  # equal as numbers, not bits
    assert bits_equal(np.float32([np.nan]), np.float32([np.nan]))
    assert not bits_equal(a, a[:2])
    c = Counts()
    assert c.compare("same", a, a.copy()) and not c.compare("bumped", bump(a), a)
    c.check(False, "flag")
    assert c.result() == (1, 2)


def test_batch_passes(capsys) -> None:
    assert batch_check.batch_main(BATCH) == 0
    assert "gpu-batch: device cpu, weights int8, model tiny-random: 16 passed, 0 failed" in (
        capsys.readouterr().out)  # 4 sizes x (prefill + 3 decode steps)


def test_batch_catches_batch_dependent_rounding(monkeypatch, capsys) -> None:
    forward = ModelRunner.forward
    monkeypatch.setattr(ModelRunner, "forward", lambda self, batch: (
        bump(forward(self, batch)) if batch.num_segments > 1 else forward(self, batch)))
    assert batch_check.batch_main(BATCH) == 1
    # Only the batch of 1 matches the needle alone.
    assert "4 passed, 12 failed" in capsys.readouterr().out


def test_paged_passes(capsys) -> None:
    assert batch_check.paged_main(PAGED) == 0
    # 4 layouts x 6 requests x (chunk, rest or decode, 2 more steps, token check)
    assert "gpu-paged: device cpu, weights int8, model tiny-random: 120 passed, 0 failed" in (
        capsys.readouterr().out)


def test_paged_catches_contiguous_assumption(monkeypatch, capsys) -> None:
    def contiguous_only(pool, layer, table, length):  # reads pages table[0], table[0] + 1, ...
        n = -(-length // 16)
        return real(pool, layer, np.arange(table[0], table[0] + n), length)

    def contiguous_tables(q, k_pool, v_pool, layer, segments, page_tables, *args, **kwargs):
        tables = page_tables[:, :1] + np.arange(page_tables.shape[1], dtype=np.int32)
        return real_compiled(q, k_pool, v_pool, layer, segments, tables, *args, **kwargs)

    real, real_compiled = numpy_attention.gather_history, cpu_ops.paged_attention
    monkeypatch.setattr(numpy_attention, "gather_history", contiguous_only)  # BLAS-tile path
    monkeypatch.setattr(cpu_ops, "paged_attention", contiguous_tables)  # compiled path
    assert batch_check.paged_main(PAGED) == 1
    out = capsys.readouterr().out
    assert "FAIL interleaved" in out and "FAIL contiguous" not in out


def test_graph_check_passes_eager_only(capsys) -> None:
    assert graph_check.graph_main(GRAPH) == 0
    out = capsys.readouterr().out
    assert "graphs: not available on this device, checked eager only" in out
    assert "schedule: 25 requests joined, 23 finished between steps" in out
    # decode rows (1 + 3 + 17 + 2) x 3 steps = 69, plus one prefill comparison per joiner,
    # plus the 24 requests of the pipelined-vs-plain engine comparison, and its all-greedy
    # form (against an engine without graphs where there are graphs), and its fed-mixed form
    assert "pipelined engine vs plain engine: 24 requests identical, 0 failures" in out
    assert ("all-greedy pipelined engine vs an engine without graphs: 24 requests identical, "
            "0 failures") in out
    for how in ("graphs", "eager"):
        assert (f"pipelined engine, mixed steps fed ({how}), vs plain engine: 24 requests "
                "identical, 0 failures") in out
    # 419 of them mixed steps, 46 of those with histories past 1,024 (mixed_long_check, its
    # joiners 1-4 a step since its steps stay within 512 rows)
    assert "model tiny-random: 657 passed, 0 failed" in out


class _Graphs:
    num_captures = num_replays = 0  # a graphs object that never replays


@pytest.mark.parametrize("bug", ["rounding", "no-replay"])
def test_graph_check_catches(bug, monkeypatch, capsys) -> None:
    make_pair = graph_check.make_pair

    def pair(model, device, num_pages, settings=None):
        cand, ref = make_pair(model, device, num_pages, settings)
        if bug == "no-replay":
            cand.backend.graphs = _Graphs()  # the numpy backend never consults it
        else:  # a "graph" whose 3-row decode steps round differently
            forward = cand.forward
            cand.forward = lambda b: bump(forward(b)) if b.num_rows == b.num_segments == 3 \
                else forward(b)
        return cand, ref

    monkeypatch.setattr(graph_check, "make_pair", pair)
    assert graph_check.graph_main(GRAPH) == 1
    out = capsys.readouterr().out
    if bug == "no-replay":
        assert "not replayed" in out and "graphs: 0 captures, 0 replays" in out
    else:
        fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
        assert fails and all(ln.startswith("FAIL size 3 ") for ln in fails)


def test_long_mixed_check_catches(capsys) -> None:
    """A candidate whose mixed steps round differently only where a history passes 1,024
    positions (the split score capacities' case) fails the long check, and only there."""
    from crucible.checks.batch_check import check_model
    from crucible.checks.mixed_long_check import check_mixed_long
    from crucible.engine.settings import Settings

    make_pair = graph_check.make_pair

    def pair(model, device, num_pages, settings=None):
        cand, ref = make_pair(model, device, num_pages, settings)
        forward = cand.forward
        long_mixed = lambda b: ((b.segments[:, 1] > 1).any() and (b.segments[:, 1] == 1).any()
                                and int(b.segments[:, 2].max()) > 1024)  # noqa: E731
        cand.forward = lambda b: bump(forward(b)) if long_mixed(b) else forward(b)
        return cand, ref

    model = check_model("int8")
    clean = check_mixed_long(model, "cpu", Settings(), 2, 5, make_pair)
    assert clean[0] > 0 and clean[1] == 0
    capsys.readouterr()
    passed, failed = check_mixed_long(model, "cpu", Settings(), 2, 5, pair)
    assert (passed, failed) == (0, clean[0])  # every step of the check is a long mixed one
    fails = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FAIL")]
    assert fails and all(ln.startswith("FAIL long mixed step") for ln in fails)


def test_decode_prefill_passes(capsys) -> None:
    assert graph_check.decode_prefill_main(DECODE) == 0
    # 3 prompts x (step 0 + 2 decode steps) alone, plus 3 packed truncated prefills
    assert "gpu-decode-prefill: device cpu, weights int8, model tiny-random: 12 passed, 0 failed" \
        in capsys.readouterr().out


def test_decode_prefill_catches_decode_path(monkeypatch, capsys) -> None:
    forward = ModelRunner.forward

    def decode_differs(self, batch):
        out = forward(self, batch)
        return bump(out) if (batch.segments[:, 1] == 1).all() and batch.num_segments > 1 else out

    monkeypatch.setattr(ModelRunner, "forward", decode_differs)
    assert graph_check.decode_prefill_main(DECODE) == 1
    out = capsys.readouterr().out
    assert "FAIL r0 (prompt 1) decode step 1 vs prefill" in out
    assert "FAIL r0 (prompt 1) decode step 0" not in out  # step 0 came from a prefill step


def test_validate_quick_passes(capsys) -> None:
    assert validate.main(["--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    for name in ("gpu-packed-prefill-check", "gpu-batch", "gpu-paged", "gpu-graph-check",
                 "gpu-decode-prefill"):
        assert f"== {name} " in out and f"{name} " in out.split("summary")[1]
    assert "gpu-validate: 5 passed, 0 failed, 3 skipped" in out


def test_validate_reports_failures(monkeypatch, capsys) -> None:
    """A failing check and a crashing check both fail the suite; the others still run."""
    def boom(argv):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(batch_check, "paged_main", lambda argv: 1)
    monkeypatch.setattr(graph_check, "graph_main", boom)
    monkeypatch.setattr("crucible.checks.packed_check.main", lambda argv: 0)  # speed: 4 s saved
    assert validate.main(["--device", "cpu", "--quick"]) == 1
    cap = capsys.readouterr()
    table = cap.out.split("summary")[1]
    assert "gpu-paged" in table and "FAIL (exit 1)" in table and "ERROR" in table
    assert "kernel exploded" in cap.err
    assert "gpu-validate: 3 passed, 2 failed, 3 skipped" in cap.out


@pytest.mark.parametrize("bug", [False, True])
def test_large_mixed_steps_check_and_its_control(bug) -> None:
    """The pass over mixed steps past 512 rows (CRUCIBLE_MIXED_GRAPH_ROWS=1024), eagerly on
    the CPU: every row of its 896-decode steps compared; a candidate that rounds one ulp
    differently in steps past 512 rows must fail it, and 512 rows leaves nothing to check."""
    from crucible.checks.mixed_large_check import check_mixed_large
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=1, weights="int8")
    cand, ref = graph_check.make_pair(model, "cpu", 2048)
    if bug:
        forward = cand.forward
        cand.forward = lambda b: bump(forward(b)) if b.num_rows > 512 else forward(b)
    passed, failed = check_mixed_large(cand, ref, 2, 0, 1024)
    assert passed + failed >= 2 * 896 and (failed > 0) == bug
    assert check_mixed_large(cand, ref, 2, 0, 512) == (0, 0)


@pytest.mark.parametrize("main,argv,flag", [
    (batch_check.batch_main, ["--steps", "-1"], "--steps"),
    (batch_check.batch_main, ["--sizes", "0"], "--sizes"),
    (batch_check.paged_main, ["--requests", "13"], "--requests"),
    (graph_check.graph_main, ["--lengths", "x"], "--lengths")])
def test_check_commands_refuse_counts_that_check_nothing(main, argv, flag, capsys) -> None:
    """``gpu-batch --steps -1`` reported "0 passed, 0 failed"; a count out of range is now
    argparse's error naming the flag, before any model is built."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err
