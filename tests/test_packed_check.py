"""The gpu-packed-prefill-check harness, run on the CPU backend (the GPU runs it for real)."""

from __future__ import annotations

from crucible.cli import main
from crucible.checks.packed_check import Report


def test_packed_check_passes_on_cpu(capsys) -> None:
    assert main(["gpu-packed-prefill-check", "--device", "cpu", "--steps", "4", "--fuzz", "2"]) == 0
    out = capsys.readouterr().out
    assert "20/20 malformed batches rejected" in out and ", 0 failures" in out


def test_report_counts_divergence() -> None:
    """Negative control: a changed token, or a cancelled output that is no prefix, fails."""
    ref = {"0": ([1, 2, 3], [], None, "length"), "1": ([4, 5], [], None, "length")}
    rep = Report()
    rep.compare("same", {k: v for k, v in ref.items()}, ref)
    assert rep.failures == 0 and rep.sequences == 2
    rep.compare("changed", {"0": ([1, 2, 9], [], None, "length"), "1": ref["1"]}, ref)
    assert rep.failures == 1
    rep.compare("cancelled", {"0": ([7], [], None, "abort"), "1": ref["1"]}, ref, skip={"0"})
    assert rep.failures == 2
