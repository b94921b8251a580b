"""The compiled CPU GEMM: the canonical order of cuda/linear.cu, bit for bit, for every row.

Checked against an exact Python spelling of the order (tests/cpu_reference.py) and a
float64 product within the order's rounding bound; AVX2 against the portable scalar
kernel; a row alone against the same row inside batches of many sizes and positions;
thread counts; K and N that are not multiples of the chunk and panel widths; int8 + scale
and the fused residual; clear errors for bad input.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.backend import cpu_ext
from crucible.backend.cpu_gemm import gemm, pack_weight
from tests.cpu_reference import canonical_gemm

pytestmark = pytest.mark.skipif(cpu_ext.extension() is None,
                                reason="compiled CPU kernels not built (pip install -e .)")
needs_avx2 = pytest.mark.skipif(cpu_ext.kernel_name() != "avx2", reason="no AVX2+FMA here")
U = 2.0**-24  # f32 unit roundoff


def _data(rng: np.random.Generator, m: int, n: int, k: int, int8: bool):
    x = rng.standard_normal((m, k)).astype(np.float32)
    if int8:
        q = rng.integers(-127, 128, (n, k)).astype(np.int8)
        scale = (rng.random(n) * 0.02 + 1e-3).astype(np.float32)
        return x, q, scale
    return x, rng.standard_normal((n, k)).astype(np.float32), None


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("k", [1, 63, 64, 65, 130])
def test_exact_canonical_order(k: int, int8: bool) -> None:
    """Bit-exact against a from-scratch Python spelling of linear.cu's order."""
    rng = np.random.default_rng(k)
    x, w, scale = _data(rng, 3, 19, k, int8)
    res = rng.standard_normal((3, 19)).astype(np.float32)
    packed = pack_weight(w, scale)
    for kernel in ("avx2", "scalar"):
        if kernel == "avx2" and cpu_ext.kernel_name() != "avx2":
            continue
        got = gemm(x, packed, res, threads=2, scalar=kernel == "scalar")
        assert np.array_equal(got, canonical_gemm(x, w, scale, res)), kernel


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (100, 100), (33, 577)])
def test_against_float64_within_the_order_bound(n: int, k: int, int8: bool) -> None:
    """|y - exact| <= (64 + chunks + 2) u (sum_k |x w| |s| + |r|): the chain of at most 64
    fmas, the chunk sums, the scale and the residual each round once per element."""
    rng = np.random.default_rng(n + k)
    x, w, scale = _data(rng, 37, n, k, int8)
    res = rng.standard_normal((37, n)).astype(np.float32)
    got = gemm(x, pack_weight(w, scale), res, threads=2)
    w64 = w.astype(np.float64) * (1.0 if scale is None else scale.astype(np.float64)[:, None])
    exact = res + x.astype(np.float64) @ w64.T
    bound = (64 + -(-k // 64) + 2) * U * (np.abs(x) @ np.abs(w64).T + np.abs(res))
    err = np.abs(got - exact)
    assert (err <= bound).all(), float((err / bound).max())
    assert err.max() > 0  # f32 arithmetic really ran


@needs_avx2
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 13, 64, 150])
def test_avx2_equals_scalar(m: int, int8: bool) -> None:
    rng = np.random.default_rng(m)
    for n, k in ((97, 130), (960, 576), (200, 1536)):
        x, w, scale = _data(rng, m, n, k, int8)
        res = rng.standard_normal((m, n)).astype(np.float32)
        packed = pack_weight(w, scale)
        assert np.array_equal(gemm(x, packed, res, threads=2),
                              gemm(x, packed, res, threads=1, scalar=True)), (n, k)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n,k", [(960, 576), (100, 65), (3072, 64)])
def test_row_alone_equals_row_in_any_batch(n: int, k: int, int8: bool) -> None:
    rng = np.random.default_rng(7)
    x, w, scale = _data(rng, 200, n, k, int8)
    packed = pack_weight(w, scale)
    full = gemm(x, packed, threads=2)
    alone = np.concatenate([gemm(x[i : i + 1], packed, threads=2) for i in range(200)])
    assert np.array_equal(alone, full)
    for size in (2, 3, 5, 6, 7, 11, 12, 13, 64, 97):
        start = int(rng.integers(0, 200 - size))
        assert np.array_equal(gemm(x[start : start + size], packed), full[start : start + size])
    order = rng.permutation(200)
    assert np.array_equal(gemm(x[order], packed, threads=2), full[order])


@pytest.mark.parametrize("int8", [False, True])
def test_thread_count_changes_no_bit(int8: bool) -> None:
    rng = np.random.default_rng(3)
    for m in (1, 5, 70):
        x, w, scale = _data(rng, m, 1000, 320, int8)
        packed = pack_weight(w, scale)
        want = gemm(x, packed, threads=1)
        for threads in (2, 3, 4, 7, 16):
            assert np.array_equal(gemm(x, packed, threads=threads), want), (m, threads)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33])
@pytest.mark.parametrize("k", [1, 63, 65, 100, 129])
def test_odd_sizes(n: int, k: int) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    x, w, _ = _data(rng, 9, n, k, False)
    got = gemm(x, pack_weight(w), threads=2)
    if n * k <= 2000:  # the exact reference is slow (rational arithmetic)
        assert np.array_equal(got, canonical_gemm(x, w))
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


def test_int8_is_the_f32_code_sum_times_scale_and_residual_comes_last() -> None:
    """The order's last two steps, exactly: y = r + (total * scale)."""
    rng = np.random.default_rng(5)
    x, q, scale = _data(rng, 21, 130, 200, True)
    res = rng.standard_normal((21, 130)).astype(np.float32)
    total = gemm(x, pack_weight(q.astype(np.float32)))
    assert np.array_equal(gemm(x, pack_weight(q, scale)), total * scale)
    assert np.array_equal(gemm(x, pack_weight(q, scale), res), res + total * scale)


def test_int8_panels_stay_int8() -> None:
    q = np.ones((40, 70), dtype=np.int8)
    packed = pack_weight(q, np.ones(40, dtype=np.float32))
    assert packed.panels.dtype == np.int8 and packed.panels.shape == (3, 70, 16)
    assert np.array_equal(packed.dense(), q.astype(np.float32))


def test_empty_batch() -> None:
    packed = pack_weight(np.ones((8, 8), dtype=np.float32))
    assert gemm(np.zeros((0, 8), dtype=np.float32), packed).shape == (0, 8)


def test_bad_input_gives_clear_errors() -> None:
    w = np.ones((8, 16), dtype=np.float32)
    packed = pack_weight(w)
    with pytest.raises(TypeError, match="float32"):
        gemm(np.ones((2, 16)), packed)  # float64
    with pytest.raises(ValueError, match="K=15"):
        gemm(np.ones((2, 15), dtype=np.float32), packed)
    with pytest.raises(ValueError, match="residual"):
        gemm(np.ones((2, 16), dtype=np.float32), packed, np.ones((3, 8), dtype=np.float32))
    with pytest.raises(ValueError, match="scale"):
        pack_weight(w.astype(np.int8))
    with pytest.raises(ValueError, match="int8 weights only"):
        pack_weight(w, np.ones(8, dtype=np.float32))
    with pytest.raises(TypeError, match="float32 or int8"):
        pack_weight(w.astype(np.float16))
    with pytest.raises(ValueError, match="non-empty"):
        pack_weight(np.ones((0, 4), dtype=np.float32))


def test_the_extension_checks_buffers_itself() -> None:
    """Past the wrapper, a wrong buffer is still an error, never an out-of-bounds access."""
    ext = cpu_ext.extension()
    x = np.ones((2, 16), dtype=np.float32)
    panels = pack_weight(np.ones((8, 16), dtype=np.float32)).panels
    out = np.empty((2, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="expected 32 items"):
        ext.gemm(x[:1], panels, None, None, out, 2, 8, 16, 1, True)
    with pytest.raises(ValueError, match="packed weight"):
        ext.gemm(x, panels[:, :8], None, None, out, 2, 8, 16, 1, True)
    with pytest.raises(TypeError, match="float32"):
        ext.gemm(x.astype(np.float64), panels, None, None, out, 2, 8, 16, 1, True)
    with pytest.raises(ValueError, match="int8 weights need a scale"):
        ext.gemm(x, panels.astype(np.int8), None, None, out, 2, 8, 16, 1, True)
    with pytest.raises(ValueError, match="overlaps"):
        ext.gemm(x, panels, None, None, x.reshape(-1)[:16], 2, 8, 16, 1, True)
    with pytest.raises(ValueError, match="bad sizes"):
        ext.gemm(x, panels, None, None, out, 2, 8, 16, 0, True)
    with pytest.raises(TypeError):
        ext.gemm(x, panels, None, None, out.astype(np.float64), 2, 8, 16, 1, True)


def test_concurrent_callers_get_the_same_bits() -> None:
    """Python threads calling at once (the pool runs one call, the others inline)."""
    import threading

    rng = np.random.default_rng(9)
    x, w, scale = _data(rng, 33, 700, 300, True)
    packed = pack_weight(w, scale)
    want = gemm(x, packed, threads=1)
    results: list[bool] = []

    def call() -> None:
        results.extend(np.array_equal(gemm(x, packed, threads=2), want) for _ in range(20))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80 and all(results)


def test_pool_works_in_a_forked_child() -> None:
    """The parent's workers do not exist after fork(); the child must start its own."""
    import os
    import time

    rng = np.random.default_rng(10)
    x, w, _ = _data(rng, 20, 500, 200, False)
    packed = pack_weight(w)
    want = gemm(x, packed, threads=2)  # the parent's pool is up
    pid = os.fork()
    if pid == 0:  # child: exit code says whether it got the same bits
        ok = np.array_equal(gemm(x, packed, threads=2), want)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in the thread pool")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
