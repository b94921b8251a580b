"""The float64 oracle and the synthetic batches the GPU check is built on (CPU only)."""

from __future__ import annotations

import numpy as np

from crucible.checks.attention_cases import (
    LAYER, Case, build, remap_pages, reverse_segments, single_segment, truncate_and_poison)
from crucible.checks.oracle import oracle_rows


def _dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, heads: int, kv: int):
    """Plain causal attention over contiguous K/V: the textbook formula, no pages."""
    t, group = q.shape[0], heads // kv
    out = np.zeros((t, heads * 64))
    for r in range(t):
        for h in range(heads):
            c = slice((h // group) * 64, (h // group + 1) * 64)
            s = k[: start + r + 1, c] @ q[r, h * 64:(h + 1) * 64] / 8.0
            w = np.exp(s - s.max())
            out[r, h * 64:(h + 1) * 64] = w @ v[: start + r + 1, c] / w.sum()
    return out


def _contiguous(b, i):
    start, length = b.case.slices[i]
    pos = np.arange(start + length)
    pages = b.page_tables[i, pos // 16]
    return (b.k_pool[pages, LAYER, pos % 16].astype(np.float64),
            b.v_pool[pages, LAYER, pos % 16].astype(np.float64))


def test_oracle_matches_dense_attention_through_shuffled_pages() -> None:
    b = build(Case("t", 8, 2, ((37, 20), (0, 5)), pages="interleaved", seed=3))
    rows = list(range(b.q.shape[0]))
    got = oracle_rows(b.q, b.k_pool, b.v_pool, LAYER, b.segments, b.page_tables, rows, 8, 2)
    k, v = _contiguous(b, 0)
    np.testing.assert_allclose(got[:20], _dense(b.q[:20].astype(np.float64), k, v, 37, 8, 2),
                               rtol=1e-12, atol=1e-12)
    k, v = _contiguous(b, 1)
    np.testing.assert_allclose(got[20:], _dense(b.q[20:].astype(np.float64), k, v, 0, 8, 2),
                               rtol=1e-12, atol=1e-12)


def test_pool_is_poisoned_outside_each_history() -> None:
    b = build(Case("t", 4, 4, ((3, 10),), seed=1))  # history ends at position 13
    assert np.isnan(b.k_pool[:, 0]).all() and np.isnan(b.v_pool[:, 2]).all()
    page = b.page_tables[0, 0]
    assert np.isfinite(b.k_pool[page, LAYER, :13]).all()
    assert np.isnan(b.k_pool[page, LAYER, 13:]).all()


def test_views_keep_the_same_answer_row_by_row() -> None:
    b = build(Case("t", 12, 3, ((0, 9), (40, 7), (16, 4)), seed=4))
    full = oracle_rows(b.q, b.k_pool, b.v_pool, LAYER, b.segments, b.page_tables,
                       range(b.q.shape[0]), 12, 3)
    views = [remap_pages(b, 9), reverse_segments(b), single_segment(b, 1), truncate_and_poison(b)]
    for view in views:
        got = oracle_rows(view.q, view.k_pool, view.v_pool, LAYER, view.segments,
                          view.page_tables, range(view.q.shape[0]), 12, 3)
        np.testing.assert_array_equal(got, full[view.rows])
    assert not np.array_equal(remap_pages(b, 9).page_tables, b.page_tables)


def test_poison_really_sits_after_the_kept_rows() -> None:
    b = build(Case("t", 4, 4, ((0, 8),), seed=2))
    p = truncate_and_poison(b)
    page = b.page_tables[0, 0]
    assert p.segments[0, 1] == 4
    poisoned = p.k_pool[page, LAYER, 4:8]
    assert (np.isnan(poisoned) | (np.abs(poisoned) >= 1e38)).all()
    assert np.isnan(poisoned).any() and (np.abs(poisoned) >= 1e38).any()
    assert np.isfinite(p.k_pool[page, LAYER, :4]).all()
