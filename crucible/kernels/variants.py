"""The paged-attention variant registry and the launch plan that picks a kernel.

Names (``CRUCIBLE_PREFILL_ATTN``): ``reference``; ``exact`` (alias of the default
``exact-q4-k64``); ``exact-q{1,2,4}-k{16,32,64}``; ``online-q{1,2,4}-k{16,32,64}``; and the
diagnostic ``exact-q{1,2,4}-k{16,32,64}-cache`` (page-table entries staged in shared memory).
Exact variants (cached or not) are bit-identical to the reference; online ones are not.

``plan_launch`` turns a requested variant into the kernel that actually runs for one call:
an exact/online variant whose shared memory for score capacity C does not fit hands over
to fewer rows per tile, then to the reference; unsupported geometry (head_dim != 64,
G outside 1..8) runs the reference. Each distinct hand-over is reported once.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Literal

from crucible.errors import ConfigError

Family = Literal["reference", "exact", "online"]

DEFAULT_VARIANT = "exact-q4-k64"
ENV_VAR = "CRUCIBLE_PREFILL_ATTN"
ROWS_CHOICES = (1, 2, 4)
TILE_CHOICES = (16, 32, 64)
HEAD_DIM = 64
MAX_GROUP = 8
KV_STRIDE = 68  # floats per staged K/V row (see cuda/attention.cu)
STATS_FLOATS = 96  # causal lengths + per-distribution statistics
REFERENCE_STATIC_BYTES = 64  # attn_reference's static reduction scratch (upper bound)
# attn_exact_pf (cuda/attention.cu, attention_prefetch.cuh): each K/V tile's loads issued
# a tile ahead, into registers; 384 threads only (group 3). Its 80 registers allow two CTAs
# an SM, and it wins even where the plain instance fits three (C <= 1,024): on an H100,
# 1.27x and 1.42x on a chat cohort's and joiner's launches (C 1,792), 1.18x and 1.15x on 64
# slices at 960 and 512 (C 1,024 and 768), 1.03x on a 1,024-token prefill
# (bench/prefetch-attention-h100.json). Same bits (tests/cuda_host/prefill_attn_driver.cpp,
# tests/test_attention_gpu.py); memcheck and racecheck clean (bench/prefetch-*-h100.log).
PREFETCH = True
PREFETCH_GROUP = 3

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    family: Family
    rows: int = 1  # query rows per CTA tile (exact/online)
    tile: int = 64  # history positions per staged K/V tile (exact/online)
    cache: bool = False  # exact only: page-table entries cached in shared memory

    @property
    def name(self) -> str:
        if self.family == "reference":
            return "reference"
        return f"{self.family}-q{self.rows}-k{self.tile}" + ("-cache" if self.cache else "")

    @property
    def is_exact(self) -> bool:
        """Exact variants (and the reference itself) reproduce the canonical bits."""
        return self.family != "online"


def all_variants() -> tuple[Variant, ...]:
    tiled = tuple(
        Variant(family, rows, tile, cache)
        for family, cache in (("exact", False), ("online", False), ("exact", True))
        for rows in ROWS_CHOICES
        for tile in TILE_CHOICES
    )
    return (Variant("reference"),) + tiled


def valid_names() -> tuple[str, ...]:
    return ("exact",) + tuple(v.name for v in all_variants())


def parse_variant(name: str) -> Variant:
    """Strict parse of a variant name; unknown names list every valid one."""
    key = name.strip().lower()
    if key == "exact":
        key = DEFAULT_VARIANT
    for variant in all_variants():
        if variant.name == key:
            return variant
    raise ConfigError(
        f"unknown {ENV_VAR} value {name!r}; valid names: {', '.join(valid_names())}")


def startup_report(variant: Variant) -> str:
    """The one line the engine prints at startup naming the selected variant."""
    kind = {"reference": "canonical order", "exact": "bit-identical to reference",
            "online": "DIAGNOSTIC: not bit-identical, changes seeded generation"}[variant.family]
    return f"prefill attention: {variant.name} ({kind})"


def score_capacity(max_end: int) -> int:
    """Score slots per distribution: the longest absolute slice end rounded up to 256."""
    if max_end < 1:
        raise ValueError(f"max_end must be positive, got {max_end}")
    return -(-max_end // 256) * 256


def tiled_smem_bytes(variant: Variant, group: int, capacity: int) -> int:
    dists = variant.rows * group
    scores = capacity if variant.family == "exact" else variant.tile
    table_cache = capacity // 16 if variant.cache else 0  # one int per page of history
    return 4 * (variant.tile * KV_STRIDE + dists * HEAD_DIM + STATS_FLOATS + dists * scores
                + table_cache)


def reference_smem_bytes(capacity: int) -> int:
    return 4 * capacity


DECODE_V_TILE = 128  # attn_decode's staged V positions (CRU_DEC_VT)


DECODE_GROUPS = (1, 2, 3, 4)  # query heads per attn_decode CTA (instantiated; G*64 <= 256)
# attn_decode's RoPE-in form (a CTA per KV head and row: the group a CTA), instantiated for
# the default model's group; other groups keep the separate rope_store launch.
ROPE_IN_GROUPS = (3,)


def decode_smem_bytes(capacity: int, heads: int = 1) -> int:
    return 4 * (DECODE_V_TILE * HEAD_DIM + heads * capacity + capacity // 16)


def decode_static_bytes(heads: int = 1, rope: bool = False) -> int:
    """attn_decode's static shared memory, rounded up: q (heads*64 floats) and the softmax
    scratch (18 floats per head), and the RoPE-in form's K and V row (128 floats). Static
    and dynamic bytes share the per-CTA opt-in limit."""
    return 4 * (heads * HEAD_DIM + 18 * heads + (2 * HEAD_DIM if rope else 0)) + 16


def decode_heads_per_cta(n_heads: int, n_kv_heads: int, rows: int, sm_count: int) -> int:
    """1 (a CTA per query head) unless the step has enough rows that a CTA per KV head
    still fills the GPU; then the whole group, so each K/V row is read once for it."""
    group = n_heads // n_kv_heads if n_kv_heads and n_heads % n_kv_heads == 0 else 1
    if group in DECODE_GROUPS and rows * n_kv_heads >= sm_count:
        return group
    return 1


PREFETCH_VARIANT = Variant("exact", 4, 64)


@dataclass(frozen=True)
class LaunchPlan:
    variant: Variant  # what actually runs
    requested: Variant
    smem_bytes: int  # dynamic shared memory per CTA
    threads: int
    reason: str | None = None  # why it differs from the request
    decode: bool = False  # the exact family's decode launch (attn_decode, same bits)
    decode_heads: int = 1  # query heads per attn_decode CTA
    prefetch: bool = False  # attn_exact's prefetching instance (PREFETCH above)


@functools.lru_cache(maxsize=4096)  # asked for every layer of every step, with few keys
def plan_launch(requested: Variant, *, n_heads: int, n_kv_heads: int, head_dim: int,
                capacity: int, smem_limit: int, decode: bool = False, rows: int = 0,
                sm_count: int = 132, prefetch: bool = False) -> LaunchPlan:
    """Pick the kernel for one call; the result is a pure function of its arguments.

    ``decode``: every segment is one row (``rows`` of them). The exact family then runs
    attn_decode, which is bit-identical to the reference (as every exact kernel is) and
    built for single rows; with many rows each CTA serves a KV head's whole group.
    ``prefetch`` (callers pass PREFETCH): exact-q4-k64 at group 3 runs its prefetching
    instance."""
    ref = LaunchPlan(Variant("reference"), requested, reference_smem_bytes(capacity), 256)
    if ref.smem_bytes + REFERENCE_STATIC_BYTES > smem_limit:
        # Nothing can hold a score vector this long; refuse rather than launch out of bounds.
        raise ValueError(f"score capacity {capacity} exceeds every attention kernel's shared "
                         f"memory ({smem_limit} B per CTA)")
    if requested.family == "reference":
        return ref
    if decode and requested.family == "exact":
        heads = decode_heads_per_cta(n_heads, n_kv_heads, rows, sm_count)

        def fits(h: int) -> bool:
            return decode_smem_bytes(capacity, h) + decode_static_bytes(h) <= smem_limit

        if not fits(heads):
            heads = 1
        if fits(heads):
            return LaunchPlan(requested, requested, decode_smem_bytes(capacity, heads), 256,
                              decode=True, decode_heads=heads)
    group = n_heads // n_kv_heads if n_kv_heads and n_heads % n_kv_heads == 0 else 0
    if head_dim != HEAD_DIM or not 1 <= group <= MAX_GROUP:
        return _reported(ref, f"geometry heads={n_heads}/{n_kv_heads} head_dim={head_dim} "
                              "is outside the tiled family")
    rows = requested.rows
    while rows >= 1:
        candidate = Variant(requested.family, rows, requested.tile, requested.cache)
        smem = tiled_smem_bytes(candidate, group, capacity)
        if smem <= smem_limit:
            pf = prefetch and candidate == PREFETCH_VARIANT and group == PREFETCH_GROUP
            plan = LaunchPlan(candidate, requested, smem, 32 * rows * group, prefetch=pf)
            if rows == requested.rows:
                return plan
            return _reported(plan, f"capacity {capacity} needs fewer rows per tile")
        rows //= 2
    return _reported(ref, f"capacity {capacity} does not fit shared memory ({smem_limit} B)")


def _reported(plan: LaunchPlan, reason: str) -> LaunchPlan:
    plan = LaunchPlan(plan.variant, plan.requested, plan.smem_bytes, plan.threads, reason,
                      prefetch=plan.prefetch)
    _say_once(plan.requested.name, plan.variant.name, reason)
    return plan


@functools.cache
def _say_once(requested: str, actual: str, reason: str) -> None:
    # Cached so a steady stream of identical calls logs the hand-over a single time.
    _log.warning("attention variant %s runs as %s: %s", requested, actual, reason)


def cuda_geometry_problem(geometry: Any) -> str | None:
    """Why the CUDA kernels cannot run this model's shape (None: they can). The attention
    kernels hold a head's 64 values in fixed lanes, so any other head size would fail at the
    first step with a kernel's argument error; the engine says so before the upload instead."""
    if geometry.head_dim != HEAD_DIM:
        return (f"the CUDA kernels take head_dim {HEAD_DIM}; this model's head_dim is "
                f"{geometry.head_dim}")
    return None


def require_cuda_geometry(geometry: Any) -> None:
    """The CUDA backend's check at the weights' upload: a clear error, not a kernel's."""
    problem = cuda_geometry_problem(geometry)
    if problem:
        raise ConfigError(f"--device cuda: {problem} (--device cpu runs any head size)")
