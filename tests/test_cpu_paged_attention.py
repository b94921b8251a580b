"""cpu_ops.paged_attention: a whole step's attention in one call, read through the page tables.

Against the per-segment path it replaces (gather each segment's K/V history with numpy,
then cpu_ops.attention on the gathered copy), bit for bit, over random steps: prefill chunks
and decode rows, shuffled physical pages, G = 1..8, head_dim 16/64, 1-3 threads, scalar and
AVX2. Every pool value a row must not read (other layers, unused pages, slots past a
segment's history) is NaN, so a wrong address shows. A swapped page must change the result
(negative control); bad arguments raise ValueError naming the problem.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.backend import cpu_ext, cpu_ops

pytestmark = pytest.mark.skipif(cpu_ext.extension() is None,
                                reason="compiled CPU kernels not built (pip install -e .)")
KERNELS = ["scalar"] + (["avx2"] if cpu_ext.kernel_name() == "avx2" else [])
LAYER, N_LAYERS, NUM_PAGES = 1, 3, 160


def _reference(q, k_pool, v_pool, layer, segments, page_tables, h, kv, hd, *, threads, scalar):
    """The old compiled path: per segment, gather its history, attend on the copy."""
    out = np.full_like(q, np.nan)
    for start, length, first, table in segments.tolist():
        end = first + length
        pages = page_tables[table, : -(-end // 16)]
        k = k_pool[pages, layer].reshape(-1, k_pool.shape[-1])[:end]
        v = v_pool[pages, layer].reshape(-1, v_pool.shape[-1])[:end]
        out[start : start + length] = cpu_ops.attention(
            q[start : start + length], k, v, first, h, kv, hd, threads=threads, scalar=scalar)
    return out


def _step(rng, kv, hd, g, n_segments, num_pages=NUM_PAGES):
    """A random step: prefill chunks and decode rows, each segment on its own pages."""
    kv_dim = kv * hd
    k_pool = np.full((num_pages, N_LAYERS, 16, kv_dim), np.nan, dtype=np.float32)
    v_pool = np.full_like(k_pool, np.nan)
    free = list(rng.permutation(num_pages))
    width = 12
    tables = rng.integers(0, num_pages, (n_segments + 2, width)).astype(np.int32)  # garbage
    table_of = rng.permutation(n_segments + 2)[:n_segments]  # segments use shuffled rows
    segs, start = [], 0
    for i in range(n_segments):
        if rng.random() < 0.5:
            length, first = 1, int(rng.integers(0, 150))  # a decode row
        else:
            length = int(rng.integers(1, 48))  # a prefill chunk, maybe mid-prompt
            first = int(rng.integers(0, 120)) if rng.random() < 0.5 else 0
        end = first + length
        n_pages = -(-end // 16)
        pages = [free.pop() for _ in range(n_pages)]
        tables[table_of[i], :n_pages] = pages
        for p, page in enumerate(pages):  # real data only where the history is
            used = min(16, end - 16 * p)
            k_pool[page, LAYER, :used] = rng.standard_normal((used, kv_dim)) * 0.5
            v_pool[page, LAYER, :used] = rng.standard_normal((used, kv_dim))
        segs.append((start, length, first, table_of[i]))
        start += length
    q = rng.standard_normal((start, kv * g * hd)).astype(np.float32)
    return q, k_pool, v_pool, np.array(segs, dtype=np.int32), tables


@pytest.mark.parametrize("g", range(1, 9))
@pytest.mark.parametrize("hd", [16, 64])
def test_one_call_equals_per_segment_path_bit_for_bit(g: int, hd: int) -> None:
    rng = np.random.default_rng(100 * g + hd)
    for trial in range(3):
        kv = int(rng.integers(1, 4))
        q, k_pool, v_pool, segs, tables = _step(rng, kv, hd, g, int(rng.integers(1, 13)))
        got = {}
        for kern in KERNELS:
            scalar = kern == "scalar"
            want = _reference(q, k_pool, v_pool, LAYER, segs, tables, kv * g, kv, hd,
                              threads=2, scalar=scalar)
            assert not np.isnan(want).any()
            for threads in (1, 2, 3):
                out = cpu_ops.paged_attention(q, k_pool, v_pool, LAYER, segs, tables, kv * g,
                                              kv, hd, threads=threads, scalar=scalar)
                assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), \
                    (trial, kern, threads)
            got[kern] = out
        assert all(np.array_equal(o, got["scalar"]) for o in got.values())


def test_many_segments_and_long_rows() -> None:
    rng = np.random.default_rng(7)
    kv, g, hd = 2, 4, 64
    q, k_pool, v_pool, segs, tables = _step(rng, kv, hd, g, 40, num_pages=480)
    for kern in KERNELS:
        scalar = kern == "scalar"
        want = _reference(q, k_pool, v_pool, LAYER, segs, tables, kv * g, kv, hd, threads=3,
                          scalar=scalar)
        got = cpu_ops.paged_attention(q, k_pool, v_pool, LAYER, segs, tables, kv * g, kv, hd,
                                      threads=3, scalar=scalar)
        assert np.array_equal(got, want)


def test_swapped_pages_change_the_rows_that_read_them() -> None:
    """Negative control: the kernel really follows the table (two pages swapped differ)."""
    rng = np.random.default_rng(3)
    kv, g, hd = 1, 2, 16
    k_pool = rng.standard_normal((8, 1, 16, kv * hd)).astype(np.float32)
    v_pool = rng.standard_normal((8, 1, 16, kv * hd)).astype(np.float32)
    q = rng.standard_normal((2, kv * g * hd)).astype(np.float32)
    segs = np.array([[0, 1, 10, 0], [1, 1, 40, 1]], dtype=np.int32)  # row 1 reads 3 pages
    tables = np.array([[5, 0, 0], [2, 6, 3]], dtype=np.int32)
    swapped = tables.copy()
    swapped[1, [0, 1]] = swapped[1, [1, 0]]
    for kern in KERNELS:
        args = (kv * g, kv, hd)
        a = cpu_ops.paged_attention(q, k_pool, v_pool, 0, segs, tables, *args,
                                    scalar=kern == "scalar")
        b = cpu_ops.paged_attention(q, k_pool, v_pool, 0, segs, swapped, *args,
                                    scalar=kern == "scalar")
        assert np.array_equal(a[0], b[0])  # row 0 reads neither page
        assert not np.array_equal(a[1], b[1])


def _small():
    pool = np.zeros((4, 2, 16, 16), dtype=np.float32)
    q = np.ones((3, 32), dtype=np.float32)
    segs = np.array([[0, 2, 15, 0], [2, 1, 5, 1]], dtype=np.int32)  # rows at 15, 16; 5
    tables = np.array([[1, 3], [2, 0]], dtype=np.int32)
    return q, pool, segs, tables


def _call(q, pool, segs, tables, layer=1, n_heads=2, n_kv=1, hd=16):
    return cpu_ops.paged_attention(q, pool, pool, layer, segs, tables, n_heads, n_kv, hd)


def test_small_case_runs() -> None:
    q, pool, segs, tables = _small()
    assert _call(q, pool, segs, tables).shape == q.shape
    unread = np.array([[1, 3], [2, -7]], dtype=np.int32)  # past segment 1's single page
    assert np.array_equal(_call(q, pool, segs, unread), _call(q, pool, segs, tables))
    empty = np.zeros((0, 4), dtype=np.int32)
    assert _call(q[:0], pool, empty, tables).shape == (0, 32)


@pytest.mark.parametrize("change,match", [
    (lambda q, p, s, t: (q, p, s, np.array([[1, 4], [2, 0]], np.int32)), "page id"),
    (lambda q, p, s, t: (q, p, s, np.array([[1, 3], [-1, 0]], np.int32)), "page id"),
    (lambda q, p, s, t: (q, p, np.array([[0, 2, 15, 0], [2, 1, 40, 1]], np.int32), t),
     "more than the tables' 2 pages"),
    (lambda q, p, s, t: (q, p, np.array([[0, 2, 15, 0], [2, 1, 5, 2]], np.int32), t),
     "table_index"),
    (lambda q, p, s, t: (q, p, np.array([[0, 2, 15, 0], [1, 1, 5, 1]], np.int32), t), "tile"),
    (lambda q, p, s, t: (q, p, np.array([[0, 2, 15, 0]], np.int32), t), "tile"),
    (lambda q, p, s, t: (q, p, np.array([[1, 2, 14, 0], [0, 1, 5, 1]], np.int32), t), "tile"),
    (lambda q, p, s, t: (q, p, s.astype(np.int64), t), "segments must be int32"),
    (lambda q, p, s, t: (q, p, s, t.astype(np.int64)), "page_tables must be int32"),
    (lambda q, p, s, t: (q, p[:, :, :, :8], s, t), "C-contiguous"),
    (lambda q, p, s, t: (q, np.zeros((4, 2, 8, 16), np.float32), s, t), "pool shape"),
    (lambda q, p, s, t: (q.astype(np.float64), p, s, t), "q must be float32"),
    (lambda q, p, s, t: (q[:, :16].copy(), p, s, t), "q width"),
])
def test_bad_arguments_raise_value_errors(change, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _call(*change(*_small()))


def test_bad_layer_and_geometry() -> None:
    q, pool, segs, tables = _small()
    with pytest.raises(ValueError, match="layer 2 outside"):
        _call(q, pool, segs, tables, layer=2)
    with pytest.raises(ValueError, match="multiple of n_kv"):
        _call(q, pool, segs, tables, n_heads=3, n_kv=2)
    with pytest.raises(ValueError, match="multiple of 8"):
        _call(np.ones((3, 24), np.float32), np.zeros((4, 2, 16, 12), np.float32), segs,
              tables, hd=12)


def test_the_extension_checks_too() -> None:
    """Called directly (no Python checks), a bad page or tiling still never reads memory."""
    q, pool, segs, tables = _small()
    out = np.empty_like(q)
    ext = cpu_ext.extension()
    scale = float(np.float32(0.25))

    def raw(s, t):
        ext.paged_attention(q, pool, pool, out, 1, s, t, 3, 4, 2, s.shape[0], t.shape[0],
                            t.shape[1], 2, 1, 16, scale, 1, False)

    raw(segs, tables)
    with pytest.raises(ValueError, match="outside the pool"):
        raw(segs, np.array([[1, 9], [2, 0]], np.int32))
    with pytest.raises(ValueError, match="tile"):
        raw(np.array([[0, 2, 15, 0], [3, 1, 5, 1]], np.int32), tables)
    with pytest.raises(ValueError, match="cover"):
        raw(np.array([[0, 2, 15, 0]], np.int32), tables)
    with pytest.raises(ValueError, match="history"):
        raw(np.array([[0, 2, 15, 0], [2, 1, 40, 1]], np.int32), tables)
