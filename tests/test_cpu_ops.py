"""The compiled non-GEMM stages: attention, RMSNorm, SwiGLU, RoPE (crucible.backend.cpu_ops).

Each against a float64 (or, for RoPE, the numpy backend's own f32) reference; AVX2 against
the scalar kernels bit for bit; a row's result alone, inside a segment, with any thread
count and with garbage past its causal end, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.backend import cpu_ext, cpu_ops
from crucible.backend.numpy_backend import _rotate

pytestmark = pytest.mark.skipif(cpu_ext.extension() is None,
                                reason="compiled CPU kernels not built (pip install -e .)")
KERNELS = ["scalar"] + (["avx2"] if cpu_ext.kernel_name() == "avx2" else [])


def _attention64(q, k, v, first, h, kv, hd):
    """float64 causal softmax attention of rows at positions first, first + 1, ..."""
    n, g = q.shape[0], h // kv
    out = np.zeros((n, h * hd))
    for r in range(n):
        end = first + r + 1
        for head in range(h):
            c = (head // g) * hd
            s = k[:end, c : c + hd].astype(np.float64) @ q[r, head * hd : (head + 1) * hd]
            p = np.exp(s / np.sqrt(hd) - (s / np.sqrt(hd)).max())
            out[r, head * hd : (head + 1) * hd] = (p / p.sum()) @ v[:end, c : c + hd]
    return out


def _qkv(rng, n, length, h, kv, hd):
    q = rng.standard_normal((n, h * hd)).astype(np.float32)
    k = (rng.standard_normal((length, kv * hd)) * 0.5).astype(np.float32)
    v = rng.standard_normal((length, kv * hd)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("h,kv,hd", [(9, 3, 64), (4, 2, 16), (2, 2, 8), (8, 2, 72), (4, 1, 128)])
def test_attention_against_float64_and_scalar(h: int, kv: int, hd: int) -> None:
    rng = np.random.default_rng(h * hd)
    first, n = 29, 23
    q, k, v = _qkv(rng, n, first + n, h, kv, hd)
    got = {kern: cpu_ops.attention(q, k, v, first, h, kv, hd, threads=2,
                                   scalar=kern == "scalar") for kern in KERNELS}
    np.testing.assert_allclose(got["scalar"], _attention64(q, k, v, first, h, kv, hd),
                               rtol=1e-5, atol=2e-6)
    assert all(np.array_equal(g, got["scalar"]) for g in got.values())


@pytest.mark.parametrize("kernel", KERNELS)
def test_attention_row_alone_equals_row_in_segment(kernel: str) -> None:
    rng = np.random.default_rng(1)
    h, kv, hd, first, n = 9, 3, 64, 40, 37
    q, k, v = _qkv(rng, n, first + n, h, kv, hd)
    scalar = kernel == "scalar"
    whole = cpu_ops.attention(q, k, v, first, h, kv, hd, threads=2, scalar=scalar)
    for r in (0, 1, 7, 8, 9, 36):  # alone: its history ends right after it, garbage beyond
        kg, vg = k.copy(), v.copy()
        kg[first + r + 1 :], vg[first + r + 1 :] = np.nan, np.nan
        alone = cpu_ops.attention(q[r : r + 1], kg, vg, first + r, h, kv, hd, scalar=scalar)
        assert np.array_equal(alone[0], whole[r]), r
    for threads in (1, 3, 8):
        assert np.array_equal(cpu_ops.attention(q, k, v, first, h, kv, hd, threads=threads,
                                                scalar=scalar), whole)


@pytest.mark.parametrize("d", [576, 96, 13])
def test_rmsnorm(d: int) -> None:
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((50, d)) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    got = {kern: cpu_ops.rmsnorm(x, w, 1e-5, threads=2, scalar=kern == "scalar")
           for kern in KERNELS}
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got["scalar"], want, rtol=2e-6, atol=1e-6)
    assert all(np.array_equal(g, got["scalar"]) for g in got.values())
    assert np.array_equal(cpu_ops.rmsnorm(x[17:18], w, 1e-5), got["scalar"][17:18])


@pytest.mark.parametrize("f", [1536, 20, 3])
def test_swiglu(f: int) -> None:
    rng = np.random.default_rng(f)
    gu = (rng.standard_normal((40, 2 * f)) * 4).astype(np.float32)
    gu[0, : min(f, 6)] = [-200.0, -88.5, -87.0, 0.0, 88.5, 200.0][: min(f, 6)]  # exp's edges
    got = {kern: cpu_ops.swiglu(gu, threads=2, scalar=kern == "scalar") for kern in KERNELS}
    g, u = gu[:, :f].astype(np.float64), gu[:, f:].astype(np.float64)
    with np.errstate(over="ignore"):
        want = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(got["scalar"], want, rtol=1e-6, atol=1e-30)
    assert all(np.array_equal(g, got["scalar"]) for g in got.values())
    assert np.array_equal(cpu_ops.swiglu(gu[5:9], threads=3), got["scalar"][5:9])


def test_rope_is_the_numpy_formula_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    heads, hd, rows = 3, 64, 33
    qkv = rng.standard_normal((rows, 5 * heads * hd)).astype(np.float32)
    cos = rng.standard_normal((rows, hd // 2)).astype(np.float32)
    sin = rng.standard_normal((rows, hd // 2)).astype(np.float32)
    col0 = 2 * heads * hd
    got = cpu_ops.rope(qkv, col0, heads, hd, cos, sin, threads=2)
    x = qkv[:, col0 : col0 + heads * hd].reshape(rows, heads, hd)
    want = _rotate(x, cos[:, None, :], sin[:, None, :]).reshape(rows, -1)
    assert np.array_equal(got, want)


def test_bad_input_gives_clear_errors() -> None:
    q = np.ones((2, 64), dtype=np.float32)
    k = np.ones((3, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_ops.attention(q, k, k, 2, 1, 1, 64)  # rows at 2, 3 need 4 history rows
    with pytest.raises(TypeError, match="float32"):
        cpu_ops.attention(q.astype(np.float64), k, k, 0, 1, 1, 64)
    with pytest.raises(ValueError, match="bad sizes"):
        cpu_ops.attention(np.ones((2, 60), dtype=np.float32), np.ones((3, 60), dtype=np.float32),
                          np.ones((3, 60), dtype=np.float32), 0, 1, 1, 60)  # hd % 8 != 0
    with pytest.raises(ValueError, match="weight"):
        cpu_ops.rmsnorm(q, np.ones(3, dtype=np.float32), 1e-5)
    with pytest.raises(ValueError, match="even"):
        cpu_ops.swiglu(np.ones((2, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="cos/sin"):
        cpu_ops.rope(q, 0, 1, 64, np.ones((2, 31), dtype=np.float32),
                     np.ones((2, 31), dtype=np.float32))
