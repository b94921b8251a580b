"""The wgmma benches' host side. bench/wgmma_probe.py: the operands it builds are what its
docstring says (exact bf16 parts, a cancelling kind whose exact sum is its one surviving
term), its float64 reference is A B + C in the layouts the kernel reads. bench/wgmma_gemm.cu:
its codes' shared-memory layout puts every k in the slot linear_mma.cu's order gives it.
Both sources build for sm_90a (skipped without nvcc). The comparisons need an H200."""

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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_wgmma_gemm_sources_build_for_sm90a(tmp_path: Path) -> None:
    import wgmma_gemm

    built = wgmma_gemm.build(tmp_path)
    assert set(built) == set(wgmma_gemm.SOURCES)
    assert all(p.stat().st_size > 0 for p in built.values())


def test_wgmma_gemm_codes_layout_puts_each_k_in_its_mma_slot() -> None:
    """bench/wgmma_gemm.cu's wg_store_codes index arithmetic, spelled in Python: read back as
    wgmma reads a no-swizzle descriptor (core matrix (kc, nc) at nc * 256 + kc * 128 bytes,
    a column's 8 slots a 16-byte row), step j's slot p of column n must hold code k = 16 t +
    4 j + s' (slots 2t, 2t+1 -> s' 0, 1; slots 2t+8, 2t+9 -> s' 2, 3), linear_mma.cu's order."""
    src = (BENCH / "wgmma_gemm.cu").read_text()
    assert "buf[j * 8 * BN + (n >> 3) * 64 + kc * 32 + (n & 7) * 4 + t]" in src
    bn = 64
    buf = np.full(2 * 32 * bn, -1, np.int64)  # bf16 slots
    for i in range(bn * 8):
        n, h = i >> 3, i & 7
        for e in range(4):
            w = 4 * h + e
            t, j, kc = w >> 3, (w & 7) >> 1, w & 1
            u = j * 8 * bn + (n >> 3) * 64 + kc * 32 + (n & 7) * 4 + t
            buf[2 * u], buf[2 * u + 1] = 1000 * n + 2 * w, 1000 * n + 2 * w + 1
    assert np.count_nonzero(buf < 0) == 0
    for j in range(4):
        for n in range(bn):
            for p in range(16):
                kc = p // 8
                at = j * 32 * bn + (n // 8) * 256 + kc * 128 + (n % 8) * 16 + (p % 8) * 2
                k = 16 * ((p % 8) // 2) + 4 * j + (p % 2) + 2 * kc
                assert buf[at // 2] == 1000 * n + k, (j, n, p)



def test_index_case_spells_each_rows_k_and_each_columns_n() -> None:
    a, b, c = wp.index_case()
    ref, _ = wp.reference(a, b, c)
    want = (np.arange(64) % 16)[:, None] + 16 * np.arange(8)[None, :]
    assert np.array_equal(ref, want)  # exact small integers: any wrong slot shows
