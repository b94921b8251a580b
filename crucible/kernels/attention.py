"""Paged causal attention on the GPU: the one entry point the engine calls.

``paged_attention(q, k_pool, v_pool, layer, segments, page_tables, out, *, n_heads,
n_kv_heads, max_chunk, score_capacity, variant, pdl)`` computes, for every packed row, causal
attention over its own request's history in the page pool and writes ``out``:

- ``q``/``out``: f32 ``[T, n_heads*64]``, C-contiguous; rows packed by segment.
- ``k_pool``/``v_pool``: f32 ``[num_pages, n_layers, 16, n_kv_heads*64]``, C-contiguous;
  the current slice's K/V must already be stored (docs/attention.md).
- ``segments``: int32 ``[S, 4]`` (packed_start, chunk_len, absolute_start, table_index),
  ascending and tiling ``0..T``; ``page_tables``: int32 ``[S_tables, P]``.
- ``max_chunk``: longest ``chunk_len``; ``score_capacity``: the longest absolute slice end
  rounded up to 256 (``score_capacity(max_end)``). Both are host integers the caller already
  knows, so no device metadata is read back here; an undersized capacity is a caller bug.
- ``variant``: a ``Variant`` or name (default ``exact-q4-k64``).
- ``pdl``: the decode kernel launches with programmatic dependent launch (launch.py).

All arrays are checked (dtype, shape, contiguity) before launch. Returns the ``LaunchPlan``
that ran, so callers can report hand-overs. Only head_dim 64 is implemented.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crucible.kernels import variants
from crucible.kernels.launch import launch
from crucible.kernels.loader import (
    attention_kernel,
    decode_kernel,
    ensure_dynamic_smem,
    l2_bytes,
    sm_count,
    smem_optin_limit,
)
from crucible.kernels.variants import (
    DEFAULT_VARIANT,
    HEAD_DIM,
    ROPE_IN_GROUPS,
    LaunchPlan,
    Variant,
    decode_static_bytes,
    parse_variant,
    plan_launch,
)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"paged_attention: {message}")


def _check_array(a: Any, name: str, dtype: Any, ndim: int) -> None:
    _check(a.dtype == dtype, f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    _check(a.ndim == ndim, f"{name} must be {ndim}-D, got shape {a.shape}")
    _check(bool(a.flags.c_contiguous), f"{name} must be C-contiguous")


def _arguments_ok(q: Any, k_pool: Any, v_pool: Any, layer: int, segments: Any,
                  page_tables: Any, out: Any, n_heads: int, n_kv_heads: int, max_chunk: int,
                  score_capacity: int) -> bool:
    """``validate_arguments``' conditions in one expression, no message built: this runs for
    every layer of every step (the messages cost more than the checks)."""
    f32, i32 = np.float32, np.int32
    return (q.dtype == f32 and out.dtype == f32 and k_pool.dtype == f32
            and v_pool.dtype == f32 and segments.dtype == i32 and page_tables.dtype == i32
            and q.ndim == 2 and out.ndim == 2 and k_pool.ndim == 4 and v_pool.ndim == 4
            and segments.ndim == 2 and page_tables.ndim == 2
            and q.flags.c_contiguous and out.flags.c_contiguous
            and k_pool.flags.c_contiguous and v_pool.flags.c_contiguous
            and segments.flags.c_contiguous and page_tables.flags.c_contiguous
            and n_heads > 0 and n_kv_heads > 0 and n_heads % n_kv_heads == 0
            and q.shape[1] == n_heads * HEAD_DIM and out.shape == q.shape
            and k_pool.shape == v_pool.shape and k_pool.shape[2] == 16
            and k_pool.shape[3] == n_kv_heads * HEAD_DIM and 0 <= layer < k_pool.shape[1]
            and segments.shape[1] == 4 and segments.shape[0] >= 1
            and page_tables.shape[1] >= 1 and 1 <= max_chunk <= q.shape[0]
            and score_capacity > 0 and score_capacity % 256 == 0)


def validate_arguments(q: Any, k_pool: Any, v_pool: Any, layer: int, segments: Any,
                       page_tables: Any, out: Any, n_heads: int, n_kv_heads: int,
                       max_chunk: int, score_capacity: int) -> None:
    """Every host-checkable precondition of the kernels; raises ValueError with the cause."""
    if _arguments_ok(q, k_pool, v_pool, layer, segments, page_tables, out, n_heads,
                     n_kv_heads, max_chunk, score_capacity):
        return
    for a, name in ((q, "q"), (out, "out")):
        _check_array(a, name, np.float32, 2)
    for a, name in ((k_pool, "k_pool"), (v_pool, "v_pool")):
        _check_array(a, name, np.float32, 4)
    _check_array(segments, "segments", np.int32, 2)
    _check_array(page_tables, "page_tables", np.int32, 2)
    _check(n_heads > 0 and n_kv_heads > 0 and n_heads % n_kv_heads == 0,
           f"n_heads {n_heads} must be a positive multiple of n_kv_heads {n_kv_heads}")
    _check(q.shape[1] == n_heads * HEAD_DIM, f"q width {q.shape[1]} != {n_heads}*{HEAD_DIM}")
    _check(out.shape == q.shape, f"out shape {out.shape} != q shape {q.shape}")
    kv_dim = n_kv_heads * HEAD_DIM
    _check(k_pool.shape == v_pool.shape, "k_pool and v_pool shapes differ")
    _check(k_pool.shape[2] == 16 and k_pool.shape[3] == kv_dim,
           f"pool shape {k_pool.shape} must be [pages, layers, 16, {kv_dim}]")
    _check(0 <= layer < k_pool.shape[1], f"layer {layer} outside 0..{k_pool.shape[1] - 1}")
    _check(segments.shape[1] == 4 and segments.shape[0] >= 1, "segments must be [S>=1, 4]")
    _check(page_tables.shape[1] >= 1, "page_tables must have at least one column")
    _check(1 <= max_chunk <= q.shape[0], f"max_chunk {max_chunk} outside 1..{q.shape[0]}")
    _check(score_capacity > 0 and score_capacity % 256 == 0,
           f"score_capacity {score_capacity} must be a positive multiple of 256")


def paged_attention(q: Any, k_pool: Any, v_pool: Any, layer: int, segments: Any,
                    page_tables: Any, out: Any, *, n_heads: int, n_kv_heads: int,
                    max_chunk: int, score_capacity: int,
                    variant: Variant | str = DEFAULT_VARIANT, pdl: bool = False) -> LaunchPlan:
    validate_arguments(q, k_pool, v_pool, layer, segments, page_tables, out, n_heads,
                       n_kv_heads, max_chunk, score_capacity)
    requested = parse_variant(variant) if isinstance(variant, str) else variant
    plan = plan_launch(requested, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=HEAD_DIM,
                       capacity=score_capacity, smem_limit=smem_optin_limit(),
                       decode=max_chunk == 1, rows=segments.shape[0], sm_count=sm_count(),
                       prefetch=variants.PREFETCH)
    kernel = (decode_kernel(plan.decode_heads) if plan.decode
              else attention_kernel(plan.variant, plan.prefetch))
    ensure_dynamic_smem(kernel, plan.smem_bytes)
    i32 = np.int32
    n_layers, stride = k_pool.shape[1], page_tables.shape[1]
    if plan.decode:
        grid = (n_heads // plan.decode_heads, segments.shape[0], 1)
        args = decode_args(q, k_pool, v_pool, layer, segments, page_tables, out, n_heads,
                           n_kv_heads, score_capacity, heads_per_cta=plan.decode_heads)
    elif plan.variant.family == "reference":
        grid = (n_heads, q.shape[0], 1)
        args = (q, k_pool, v_pool, segments, i32(segments.shape[0]), page_tables, i32(stride),
                out, i32(n_heads), i32(n_kv_heads), i32(n_layers), i32(layer))
    else:
        rows = plan.variant.rows
        grid = (n_kv_heads, -(-max_chunk // rows), segments.shape[0])
        args = (q, k_pool, v_pool, segments, page_tables, i32(stride), out, i32(n_heads),
                i32(n_kv_heads), i32(n_layers), i32(layer), i32(score_capacity))
    if plan.decode:  # the one attention kernel written for PDL (cuda/pdl.cuh)
        launch(kernel, grid, (plan.threads, 1, 1), args, shared_mem=plan.smem_bytes, pdl=pdl)
    else:
        kernel(grid, (plan.threads, 1, 1), args, shared_mem=plan.smem_bytes)
    return plan


def paged_attention_mixed(q: Any, k_pool: Any, v_pool: Any, layer: int, single: Any,
                          multi: Any, page_tables: Any, out: Any, *, n_heads: int,
                          n_kv_heads: int, multi_max_chunk: int, single_capacity: int,
                          multi_capacity: int, variant: Variant | str = DEFAULT_VARIANT,
                          pdl: bool = False, fork: Any = None) -> tuple[LaunchPlan, LaunchPlan]:
    """A mixed step's attention as two launches over its two kinds of segment: ``single``
    (one row each: the decode kernel) and ``multi`` (prefill slices: the tiled kernel, sized
    by their own longest chunk). One launch over all segments would give every decode row
    a CTA per row tile of the longest prefill chunk, all but one idle, and the tiled
    kernel's Q-row tiles hold one live row out of Q. Both kernels are bit-identical to the
    reference, and each row's result depends only on its own segment, so the bits are
    those of the single launch. ``fork`` (backend/cupy_fork.py) runs them on two streams."""
    def first() -> LaunchPlan:
        return paged_attention(q, k_pool, v_pool, layer, multi, page_tables, out,
                               n_heads=n_heads, n_kv_heads=n_kv_heads, max_chunk=multi_max_chunk,
                               score_capacity=multi_capacity, variant=variant)

    def second() -> LaunchPlan:
        return paged_attention(q, k_pool, v_pool, layer, single, page_tables, out,
                               n_heads=n_heads, n_kv_heads=n_kv_heads, max_chunk=1,
                               score_capacity=single_capacity, variant=variant, pdl=pdl)

    return fork(first, second) if fork is not None else (first(), second())


def step_attention(q: Any, k_pool: Any, v_pool: Any, layer: int, meta: Any, out: Any, *,
                   n_heads: int, n_kv_heads: int, variant: Variant, pdl: bool,
                   fork: Any = None) -> None:
    """One step's attention from its device metadata (backend/cupy_meta.py's CupyMeta, read
    by attribute): split when the step holds both kinds of segment and the variant is of
    the exact family (the one with a decode kernel), else one launch."""
    mixed = meta.mixed
    if mixed is not None and variant.family == "exact":
        paged_attention_mixed(q, k_pool, v_pool, layer, mixed.single, mixed.multi,
                              meta.page_tables, out, n_heads=n_heads, n_kv_heads=n_kv_heads,
                              multi_max_chunk=mixed.multi_max_chunk,
                              single_capacity=mixed.single_capacity,
                              multi_capacity=mixed.multi_capacity, variant=variant, pdl=pdl,
                              fork=fork)
        return
    paged_attention(q, k_pool, v_pool, layer, meta.segments, meta.page_tables, out,
                    n_heads=n_heads, n_kv_heads=n_kv_heads, max_chunk=meta.max_chunk,
                    score_capacity=meta.score_capacity, variant=variant, pdl=pdl)


KV_POSITION_BYTES = 2 * 64 * 4  # one position's K and V row of one KV head, f32
# Decode steps whose attention takes the group a CTA run RoPE and the K/V store inside it
# (attn_decode's RoPE-in form: one launch a layer fewer; backend/cupy_rope_in.py asks).
# Its bits hold on the GPU (tests/test_gpu_rope_in.py; compute-sanitizer memcheck and
# racecheck clean, bench/rope-in-*check-h100.log) and on the host (tests/cuda_host/
# decode_attn_driver.cpp). Off: one layer's QKV GEMM + attention chain took 1.15x the
# separate launches' time at 48 and 64 rows and 0.95x at 256 (H100, graph replays with
# PDL, bench/rope-in-check-h100.json): the rotation on each CTA's critical path costs more
# than the launch it saves where few CTAs run, which is batch 64, the case it was for.
ROPE_IN = False


def decode_prefetch_len(ctas: int, sharing: int = 1) -> int:
    """Positions of history each attn_decode CTA prefetches into L2 before its PDL wait.
    A small step (at most one CTA per SM: batch 1 to ~14 rows) prefetches its history into
    half the L2, ``sharing`` CTAs reading the same KV head's rows (one head per CTA: the
    group size): under PDL that overlaps the previous kernel's tail. A larger step
    prefetches nothing: its CTAs come in waves, a wave's prefetches overlap nothing, and
    on the H200 they cost 3-10% over no prefetch at 64-1,024 rows, and prefetching whole
    histories (which overflows L2) 13-25% (bench/decode-attention-h200.json). Prefetches
    change no arithmetic, so any value gives the same bits."""
    if ctas > sm_count():
        return 0
    return l2_bytes() // 2 * max(1, sharing) // (max(1, ctas) * KV_POSITION_BYTES)


def decode_args(q: Any, k_pool: Any, v_pool: Any, layer: int, segments: Any,
                page_tables: Any, out: Any, n_heads: int, n_kv_heads: int,
                score_capacity: int, o_weight: Any = None, o_parts: Any = None, *,
                heads_per_cta: int = 1, prefetch_len: int | None = None,
                o_split: int = 1, rope: tuple[Any, Any] | None = None) -> tuple:
    """attn_decode<G, OW>'s arguments (G = ``heads_per_cta``, which sizes the grid the
    prefetch budget is shared by). ``o_weight``/``o_parts`` [H, T, N_o]: the decode stack's
    O partials (crucible/kernels/decode_stack.py); null without them; ``o_split`` CTAs a
    head share its O columns. ``prefetch_len``: decode_prefetch_len's budget unless given
    (benchmarks compare budgets). ``rope``: the RoPE-in form's (cos, sin) tables, ``q``
    then the raw QKV rows (read with their own row stride)."""
    i32 = np.int32
    null = np.uint64(0)
    o = ((null, null, i32(0), i32(1)) if o_parts is None
         else (o_weight, o_parts, i32(o_parts.shape[2]), i32(o_split)))
    o += (i32(q.shape[1]),) + ((null, null) if rope is None else tuple(rope))
    if prefetch_len is None:
        sharing = n_heads // max(1, n_kv_heads) // heads_per_cta
        prefetch_len = decode_prefetch_len(n_heads // heads_per_cta * segments.shape[0],
                                           sharing)
    return (q, k_pool, v_pool, segments, i32(segments.shape[0]), page_tables,
            i32(page_tables.shape[1]), out, i32(n_heads), i32(n_kv_heads), i32(k_pool.shape[1]),
            i32(layer), i32(score_capacity), i32(min(prefetch_len, 2**31 - 1))) + o


def rope_in_plan(n_heads: int, n_kv_heads: int, rows: int, score_capacity: int,
                 variant: Variant) -> LaunchPlan | None:
    """The decode launch of a ``rows``-row decode step when it can take the step's RoPE and
    K/V store too (attn_decode's RoPE-in form: the whole group a CTA, so one CTA owns each
    KV head of a row); None where rope_store stays a launch of its own."""
    plan = plan_launch(variant, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=HEAD_DIM,
                       capacity=score_capacity, smem_limit=smem_optin_limit(), decode=True,
                       rows=rows, sm_count=sm_count())
    group = n_heads // n_kv_heads
    if not (plan.decode and plan.decode_heads == group
            and group in ROPE_IN_GROUPS and plan.smem_bytes
            + decode_static_bytes(group, rope=True) <= smem_optin_limit()):
        return None
    return plan


def decode_attention_rope(qkv: Any, cos: Any, sin: Any, k_pool: Any, v_pool: Any, layer: int,
                          segments: Any, page_tables: Any, out: Any, *, n_heads: int,
                          n_kv_heads: int, score_capacity: int, plan: LaunchPlan,
                          pdl: bool = False) -> None:
    """A decode step's RoPE, K/V store and attention in one launch (``plan`` from
    rope_in_plan): ``qkv`` [T, (H + 2 KV) * 64] as the QKV GEMM left it, ``cos``/``sin``
    [positions, 32] (rope_store's tables); row t's K/V go into the pool at its position,
    and ``out`` [T, H * 64] gets its attention: rope_store then paged_attention's bits."""
    validate_arguments(out, k_pool, v_pool, layer, segments, page_tables, out, n_heads,
                       n_kv_heads, 1, score_capacity)
    width = (n_heads + 2 * n_kv_heads) * HEAD_DIM
    _check_array(qkv, "qkv", np.float32, 2)
    _check(qkv.shape == (out.shape[0], width), f"qkv shape {qkv.shape} != ({out.shape[0]}, "
                                                f"{width})")
    for a, name in ((cos, "cos"), (sin, "sin")):
        _check_array(a, name, np.float32, 2)
        _check(a.shape[1] == HEAD_DIM // 2, f"{name} must be [positions, {HEAD_DIM // 2}]")
    _check(segments.shape[0] == out.shape[0], "a decode step has one segment a row")
    g = plan.decode_heads
    kernel = decode_kernel(g, rope=True)
    smem = plan.smem_bytes
    ensure_dynamic_smem(kernel, smem)
    args = decode_args(qkv, k_pool, v_pool, layer, segments, page_tables, out, n_heads,
                       n_kv_heads, score_capacity, heads_per_cta=g, rope=(cos, sin))
    launch(kernel, (n_heads // g, segments.shape[0], 1), (plan.threads, 1, 1), args,
           shared_mem=smem, pdl=pdl)
