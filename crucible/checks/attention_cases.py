"""Synthetic paged-attention batches for the check and bench commands (numpy only).

A ``Case`` names a geometry, the (absolute_start, chunk_len) slice of each request, how
physical pages are handed out and what the data looks like. ``build`` turns it into host
arrays laid out exactly as the engine's pool: layer 1 of a 3-layer pool holds the data;
every other layer, every unowned page and every slot past a request's slice end is NaN,
so a kernel that reads anything outside a row's causal history produces NaN and fails.

Transforms (``remap_pages``, ``reverse_segments``, ``truncate_and_poison``) rebuild the
same logical batch differently; exact outputs must not change by a single bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from crucible.kernels.variants import score_capacity

HEAD_DIM = 64
PAGE = 16
N_LAYERS = 3
LAYER = 1
DATA_MODES = ("normal", "huge", "rising", "zeros")
PAGE_MODES = ("shuffled", "interleaved")


@dataclass(frozen=True)
class Case:
    name: str
    n_heads: int
    n_kv_heads: int
    slices: tuple[tuple[int, int], ...]  # (absolute_start, chunk_len) per request
    pages: str = "shuffled"
    data: str = "normal"
    seed: int = 0


@dataclass(frozen=True)
class HostBatch:
    case: Case
    q: np.ndarray  # f32 [T, n_heads*64]
    k_pool: np.ndarray  # f32 [pages, 3, 16, kv_dim]
    v_pool: np.ndarray
    segments: np.ndarray  # int32 [S, 4]
    page_tables: np.ndarray  # int32 [S, P]
    rows: np.ndarray  # int64 [T]: canonical packed row of each row here

    @property
    def max_chunk(self) -> int:
        return int(self.segments[:, 1].max())

    @property
    def capacity(self) -> int:
        return score_capacity(int((self.segments[:, 1] + self.segments[:, 2]).max()))


def _pages_needed(slices: tuple[tuple[int, int], ...]) -> list[int]:
    return [-(-(start + length) // PAGE) for start, length in slices]


def _assign_pages(needed: list[int], mode: str, rng: np.random.Generator) -> list[list[int]]:
    total = sum(needed) + 2  # two spare pages stay unowned (NaN)
    if mode == "shuffled":
        order = iter(rng.permutation(total).tolist())
        return [[next(order) for _ in range(n)] for n in needed]
    # interleaved: physical page k+1 usually belongs to a different request than page k
    owners: list[list[int]] = [[] for _ in needed]
    phys = 1
    for k in range(max(needed)):
        for i, n in enumerate(needed):
            if k < n:
                owners[i].append(phys)
                phys += 1
    return owners


def _history(case: Case, start: int, end: int, rng: np.random.Generator,
             kv_dim: int, axis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = rng.standard_normal((end, kv_dim), dtype=np.float32)
    v = rng.standard_normal((end, kv_dim), dtype=np.float32)
    if case.data == "rising":  # scores climb with position: the running max moves a lot
        k += (np.arange(end, dtype=np.float32)[:, None] / 48.0) * np.tile(axis, kv_dim // 64)
    elif case.data == "zeros":
        k[(np.arange(end) // PAGE) % 2 == 1] = 0.0
        v[np.arange(end) % 5 == 0] = 0.0
    return k, v


def build(case: Case) -> HostBatch:
    rng = np.random.default_rng(case.seed)
    kv_dim = case.n_kv_heads * HEAD_DIM
    needed = _pages_needed(case.slices)
    owners = _assign_pages(needed, case.pages, rng)
    n_pages = max(max(o) for o in owners) + 3
    k_pool = np.full((n_pages, N_LAYERS, PAGE, kv_dim), np.nan, dtype=np.float32)
    v_pool = np.full_like(k_pool, np.nan)
    tables = np.zeros((len(case.slices), max(needed)), dtype=np.int32)
    axis = rng.standard_normal(HEAD_DIM).astype(np.float32)
    axis /= np.linalg.norm(axis)
    segments = np.zeros((len(case.slices), 4), dtype=np.int32)
    packed = 0
    for i, (start, length) in enumerate(case.slices):
        tables[i, :needed[i]] = owners[i]
        k, v = _history(case, start, start + length, rng, kv_dim, axis)
        pos = np.arange(start + length)
        k_pool[tables[i, pos // PAGE], LAYER, pos % PAGE] = k
        v_pool[tables[i, pos // PAGE], LAYER, pos % PAGE] = v
        segments[i] = (packed, length, start, i)
        packed += length
    q = rng.standard_normal((packed, case.n_heads * HEAD_DIM), dtype=np.float32)
    if case.data == "huge":
        q *= 12.0  # wide score spread: most exponentials underflow to zero
    elif case.data == "rising":
        q += 3.0 * np.tile(axis, case.n_heads)
    elif case.data == "zeros":
        q[::3] = 0.0  # all-equal scores: a uniform softmax
    return HostBatch(case, q, k_pool, v_pool, segments, tables, np.arange(packed))


def remap_pages(b: HostBatch, seed: int) -> HostBatch:
    """Same logical contents, every page moved to a fresh shuffled physical page."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(b.k_pool.shape[0])  # old physical -> new physical
    k_pool = np.empty_like(b.k_pool)
    v_pool = np.empty_like(b.v_pool)
    k_pool[perm] = b.k_pool
    v_pool[perm] = b.v_pool
    return replace(b, k_pool=k_pool, v_pool=v_pool, page_tables=perm[b.page_tables].astype(np.int32))


def reverse_segments(b: HostBatch) -> HostBatch:
    """Pack the same requests in reverse order (rows move, tables stay)."""
    segments = b.segments[::-1].copy()
    rows = np.concatenate([np.arange(s, s + n) for s, n, _, _ in segments]).astype(np.int64)
    segments[:, 0] = np.concatenate(([0], np.cumsum(segments[:-1, 1])))
    return replace(b, q=np.ascontiguousarray(b.q[rows]), segments=segments, rows=b.rows[rows])


def single_segment(b: HostBatch, index: int) -> HostBatch:
    """One request alone in its own call (composition invariance)."""
    start, length, absolute, table = b.segments[index]
    seg = np.array([[0, length, absolute, table]], dtype=np.int32)
    rows = np.arange(start, start + length)
    return replace(b, q=np.ascontiguousarray(b.q[rows]), segments=seg, rows=b.rows[rows])


def truncate_and_poison(b: HostBatch) -> HostBatch:
    """Keep the first half of each slice and fill every later position with NaN/huge."""
    k_pool, v_pool = b.k_pool.copy(), b.v_pool.copy()
    keep_rows, segments, packed = [], b.segments.copy(), 0
    for i, (start, length, absolute, table) in enumerate(b.segments):
        keep = (int(length) + 1) // 2
        end, stop = int(absolute) + keep, int(absolute + length)
        pos = np.arange(end, stop)
        pages = b.page_tables[table, pos // PAGE]
        k_pool[pages, LAYER, pos % PAGE] = np.where(pos % 2 == 0, np.nan, 3e38)[:, None]
        v_pool[pages, LAYER, pos % PAGE] = np.where(pos % 2 == 1, np.nan, -3e38)[:, None]
        keep_rows.append(np.arange(start, start + keep))
        segments[i] = (packed, keep, absolute, table)
        packed += keep
    rows = np.concatenate(keep_rows)
    return replace(b, q=np.ascontiguousarray(b.q[rows]), k_pool=k_pool, v_pool=v_pool,
                   segments=segments, rows=b.rows[rows])
