"""bench/wgmma_probe.py's host side: the operands it builds are what its docstring says
(exact bf16 parts, a cancelling kind whose exact sum is its one surviving term), its float64
reference is A B + C in the layouts the kernel reads, and its CUDA source builds for sm_90a
(skipped without nvcc). The comparison itself needs an H200."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import wgmma_probe as wp  # noqa: E402


def test_split_parts_are_exact_bf16_and_sum_to_x() -> None:
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 1e3
    parts = wp.split3(x)
    assert np.array_equal(sum(p.astype(np.float64) for p in parts), x.astype(np.float64))
    for p in parts:
        assert np.array_equal(wp.bf16_value(wp.bf16_bits(p)), p)
    assert np.count_nonzero(parts[2]) > 0  # the lo part is not trivially zero


def test_cancelling_case_sums_to_its_one_surviving_term() -> None:
    rng = np.random.default_rng(1)
    a, b, c = wp.make_case("cancel", rng)
    ref, mag = wp.reference(a, b, c)
    av = wp.bf16_value(a).astype(np.float64)
    codes = wp.bf16_value(b).astype(np.float64)  # [S, 8, 16]
    # k = 6 (step 0) is the only product left: a[:, 6] * code[n, 6]
    assert np.array_equal(ref, np.outer(av[:, 6], codes[0, :, 6]))
    assert float(np.max(np.abs(ref) / mag)) < 1e-6  # tiny against its terms


def test_reference_is_a_times_b_plus_c_in_the_kernel_layouts() -> None:
    rng = np.random.default_rng(2)
    for kind in wp.KINDS:
        a, b, c = wp.make_case(kind, rng)
        assert a.shape == (64, 16 * wp.STEPS) and a.dtype == np.uint16
        assert b.shape == (wp.STEPS, 8, 16) and c.shape == (64, 8)
        ref, _ = wp.reference(a, b, c)
        av, bv = wp.bf16_value(a).astype(np.float64), wp.bf16_value(b).astype(np.float64)
        m, n = 5, 3
        want = sum(av[m, 16 * s + k] * bv[s, n, k] for s in range(wp.STEPS) for k in range(16))
        assert ref[m, n] == pytest.approx(want + c[m, n], rel=1e-12, abs=1e-300)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_probe_source_builds_for_sm90a(tmp_path: Path) -> None:
    cubin = wp.build(tmp_path)
    assert cubin.stat().st_size > 0
