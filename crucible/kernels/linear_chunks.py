"""The chunk-parallel GEMM (cuda/linear_chunks.cu): store (+ residual) and SwiGLU
epilogues, for decode-size M (``CHUNKS_FROM[epilogue]`` to 64 rows) and, in row blocks of
64, for more rows (up to ``CHUNKS_MAX_ROWS``) where narrow weights leave the tiled kernels
too few output tiles.

Why: at 64 rows the row kernels (linear_rows.py) are GEMM-bound at 3-7 TFLOP/s, because few
CTAs each re-read the weights and run long serial K chains. Here CTA (tile, chunk) computes
one 64-wide K chunk's partials of every row for a tile of columns, so every weight byte is
read once and chunks x tiles CTAs share the work; the last CTA of a tile adds the partials
in ascending chunk order. That is the canonical order of cuda/linear.cu, so the bits are
those of the tiled and row kernels, whatever the host picks.

The partials go through a global scratch owned here: one f32 buffer and one u32 counter per
column tile and row block, per (device, stream). A stream's launches run one after another
(under PDL too: every write follows cru_pdl_wait, and each kernel of the chain waits for the
one before it), so they may share a buffer; two streams may run at once, so they never do.
Buffers are allocated on first use, sized for 64 rows or the launch's rows, grown and never
freed (a captured graph keeps the address it saw), and the counters are left at zero by
every launch: a launch allocates nothing in steady state and replays from a CUDA graph
without a memset. First use of a size must not happen inside a capture (the capture's
warm-up forward does it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.kernels.device_weight import (EPI_STORE, EPI_SWIGLU, KC, DeviceWeight, check_out,
                                            check_x, ctype, cupy, need)
from crucible.kernels.launch import launch
from crucible.kernels.linear_wide import ctas as wide_ctas
from crucible.kernels.loader import sm_count
from crucible.kernels.source import compile_module

# Rows from which the backend routes to this kernel rather than the row kernels, per
# epilogue: where the measured crossover lies (docs/gpu-engine.md, bench/gpu-kernels-h200.json).
CHUNKS_FROM = {EPI_STORE: 48, EPI_SWIGLU: 32}
CHUNKS_MAX_M = 64  # rows a CTA holds (thread tile of up to 4 rows); past it, row blocks
CHUNKS_MAX_ROWS = 1024  # rows of one launch: row blocks of 64 (blockIdx.z)
CHUNKS_MAX_SCRATCH = 32 << 20  # bytes of partials a weight may need at 64 rows (not the LM head)
CHUNKS_MAX_SCRATCH_ROWS = 64 << 20  # and past 64 rows (down at 1,024 rows: 57 MB)
# Past 64 rows the chunk kernel serves the shapes the wide kernel (linear_wide.py) serves
# poorly: by 64x64 output tiles per SM, up to ROWS_LOW (one short wave, where the wide
# kernel splits K in a CTA over 3-4 warp groups) and inside ROWS_MID (just over a wave, its
# 32x32 form). bench/gemm-chunks-h200.json, default model's shapes, M = 96..1,024: there the
# chunk kernel ran 1.1-1.7x the picked kernel (e.g. O at 256 rows 12.4 vs 8.5 TFLOP/s, down
# 15.2 vs 10.5, QKV 15.3 vs 12.7), and 0.7-0.95x of it between and above.
ROWS_LOW = 0.56
ROWS_MID = (1.0, 1.5)
# Up to here (the row kernels' last row count, linear_rows.ROWS_MAX_M) the chunk kernel beat
# what linear() and mlp_in picked on all four shapes (at 96 and 128 rows: 1.1-1.6x).
ROWS_ALWAYS_TO = 128
NT_CHOICES = (32, 64)  # columns per tile (NT in linear_chunks.cu)
THREADS = 256
# Tile width policy (chunks_nt): 64-column tiles read x half as often, but below ~2 CTAs per
# SM they leave SMs idle, and a tile's finisher reads all its partials alone
# (chunks x 64 rows x 64 columns x 4 B).
CTA_TARGET = 264
FINISH_MAX_CHUNKS = 12


def chunk_count(k: int) -> int:
    return -(-k // KC)


def chunks_mr(m: int) -> int:
    """Rows a CTA is compiled for (MR): the fewest of 16, 32, 64 that hold m, so small
    batches keep every warp busy; 64 past that (row blocks of 64)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


def row_blocks(m: int) -> int:
    """Row blocks of a launch (gridDim.z): one up to 64 rows."""
    return max(1, -(-m // chunks_mr(m)))


def n_out(n_w: int, epi: int) -> int:
    """Output columns of a [n_w, K] weight: n_w, or F = n_w / 2 for SwiGLU."""
    return n_w // 2 if epi == EPI_SWIGLU else n_w


def tile_count(n_w: int, nt: int, epi: int) -> int:
    per_tile = nt // 2 if epi == EPI_SWIGLU else nt  # NO in linear_chunks.cu
    return -(-n_out(n_w, epi) // per_tile)


def chunks_nt(n_w: int, k: int, epi: int = EPI_STORE, m: int = CHUNKS_MAX_M) -> int:
    """Default tile width: up to 64 rows, 64 columns when that still makes CTA_TARGET CTAs
    and the finisher's read stays short, else 32 (SmolLM2: gate/up 64; O and down 32). Past
    64 rows, 64 columns once row blocks make 4 x CTA_TARGET CTAs of them (measured: the
    finisher's longer read then costs less than re-reading x for twice the tiles)."""
    c = chunk_count(k)
    if m > CHUNKS_MAX_M:
        return 64 if tile_count(n_w, 64, epi) * c * row_blocks(m) >= 4 * CTA_TARGET else 32
    wide = tile_count(n_w, 64, epi) * c >= CTA_TARGET and c <= FINISH_MAX_CHUNKS
    return 64 if wide else 32


def scratch_floats(n_w: int, k: int, epi: int, nt: int, m: int = CHUNKS_MAX_M) -> int:
    """Partials of one launch of m rows: [row blocks][tiles][chunks][MR][nt]."""
    return row_blocks(m) * tile_count(n_w, nt, epi) * chunk_count(k) * chunks_mr(m) * nt


def use_chunks(m: int, n: int, k: int, epi: int = EPI_STORE, sms: int | None = None) -> bool:
    """Whether the backend runs an [n, k] weight (n = 2F for SwiGLU) on this kernel for m
    rows: K a multiple of 16 (16-byte chunk loads), a store or SwiGLU epilogue, and either
    CHUNKS_FROM[epi] <= m <= 64 with partials within CHUNKS_MAX_SCRATCH (never the LM
    head), or more rows with partials within CHUNKS_MAX_SCRATCH_ROWS: to ROWS_ALWAYS_TO, then
    (to CHUNKS_MAX_ROWS) in the tile counts the wide kernel serves poorly (ROWS_LOW,
    ROWS_MID: 64x64 output tiles per SM, ``sms`` SMs, default the device's)."""
    if epi not in CHUNKS_FROM or not CHUNKS_FROM[epi] <= m <= CHUNKS_MAX_ROWS:
        return False
    if k <= 0 or k % 16 or n <= 0 or (epi == EPI_SWIGLU and n % 2):
        return False
    if m <= CHUNKS_MAX_M:
        return 4 * max(scratch_floats(n, k, epi, nt) for nt in NT_CHOICES) <= CHUNKS_MAX_SCRATCH
    if 4 * max(scratch_floats(n, k, epi, nt, m) for nt in NT_CHOICES) > CHUNKS_MAX_SCRATCH_ROWS:
        return False
    if m <= ROWS_ALWAYS_TO:
        return True
    per_sm = wide_ctas(m, n, (64, 64)) / (sm_count() if sms is None else sms)
    return per_sm <= ROWS_LOW or ROWS_MID[0] < per_sm < ROWS_MID[1]


def aligned(*arrays: Any) -> bool:
    """Every given device array starts on a 16-byte boundary (None is skipped)."""
    return all(a is None or int(a.data.ptr) % 16 == 0 for a in arrays)


def kernel_name(wdtype: str, nt: int, mr: int, epi: int) -> str:
    return f"linear_chunks<{ctype(wdtype)}, {nt}, {mr}, {epi}>"


@functools.cache
def chunks_kernel(name: str) -> Any:
    """One module per form, so a process compiles only the forms its shapes use."""
    return compile_module("linear_chunks.cu", (name,)).get_function(name)


@dataclass
class Scratch:
    part: Any  # f32, >= tiles * chunks * 64 * nt of any launch on its stream
    counters: Any  # u32, one per column tile, zero between launches


_SCRATCH: dict[tuple[int, int], Scratch] = {}
_RETIRED: list[Scratch] = []  # outgrown buffers: a captured graph may still launch on them


def scratch(floats: int, tiles: int) -> Scratch:
    """The current stream's scratch, grown to at least ``floats`` partials and ``tiles``
    counters (from the default memory pool, never a graph cache's pool)."""
    cp = cupy()
    stream = cp.cuda.get_current_stream()
    key = (int(cp.cuda.runtime.getDevice()), int(stream.ptr))
    have = _SCRATCH.get(key)
    if have is not None and have.part.size >= floats and have.counters.size >= tiles:
        return have
    if stream.ptr != 0 and stream.is_capturing():
        raise RuntimeError("linear_chunks: first use of a shape inside a CUDA graph capture; "
                           "run the captured work once before capturing (a warm-up)")
    if have is not None:
        floats, tiles = max(floats, have.part.size), max(tiles, have.counters.size)
        _RETIRED.append(have)
    pool = cp.get_default_memory_pool()
    part = cp.ndarray((floats,), cp.float32, memptr=pool.malloc(4 * floats))
    counters = cp.ndarray((tiles,), cp.uint32, memptr=pool.malloc(4 * tiles))
    cp.cuda.runtime.memsetAsync(counters.data.ptr, 0, 4 * tiles, stream.ptr)
    _SCRATCH[key] = Scratch(part, counters)
    return _SCRATCH[key]


def current_scratch() -> Scratch | None:
    """The current stream's scratch, if any (checks read the last launch's partials)."""
    cp = cupy()
    return _SCRATCH.get((int(cp.cuda.runtime.getDevice()),
                         int(cp.cuda.get_current_stream().ptr)))


def linear_chunks(x: Any, wd: DeviceWeight, out: Any, residual: Any = None,
                  epi: int = EPI_STORE, *, nt: int | None = None, pdl: bool = False) -> Any:
    """out = x @ W^T (+ residual), or SwiGLU of the gate/up halves of a [2F, K] weight, on
    the chunk kernel. ``nt`` (32 or 64 columns per tile) overrides ``chunks_nt`` for
    benchmarks; the bits do not depend on it. Every argument is checked first: a wrong
    array is a ValueError here, never an out-of-bounds read on the device. ``pdl``: launch
    with PDL (launch.py)."""
    cp = cupy()
    need(epi in (EPI_STORE, EPI_SWIGLU), f"linear_chunks: epilogue {epi} is not built "
          "(store or SwiGLU)")
    n_w, k = wd.shape
    check_x(x, k)
    m = x.shape[0]
    need(m <= CHUNKS_MAX_ROWS, f"linear_chunks: {m} rows, at most {CHUNKS_MAX_ROWS}")
    need(0 < k <= 65535 * KC and k % 16 == 0,
          f"linear_chunks: K={k} must be a positive multiple of 16")
    wdt = wd.dtype_name
    need(wdt in ("float32", "int8") and wd.w.ndim == 2 and wd.w.flags.c_contiguous,
          "linear_chunks: the weight must be contiguous [N, K] f32 or int8")
    if wdt == "int8":
        need(wd.scale is not None and tuple(wd.scale.shape) == (n_w,)
              and wd.scale.dtype == cp.float32, f"linear_chunks: int8 needs f32 scale[{n_w}]")
    if epi == EPI_SWIGLU:
        need(n_w % 2 == 0 and residual is None,
              "linear_chunks: SwiGLU needs a [2F, K] weight and no residual")
    check_out(out, (m, n_out(n_w, epi)), "out")
    if residual is not None:
        check_out(residual, (m, n_w), "residual")
    nt = chunks_nt(n_w, k, epi, m) if nt is None else nt
    need(nt in NT_CHOICES, f"linear_chunks: {nt} columns per tile is not built {NT_CHOICES}")
    need(aligned(x, wd.w, out, residual),
          "linear_chunks: x, the weight, out and residual must start on 16-byte boundaries")
    if m == 0:
        return out
    chunks, tiles, blocks = chunk_count(k), tile_count(n_w, nt, epi), row_blocks(m)
    s = scratch(scratch_floats(n_w, k, epi, nt, m), blocks * tiles)
    fn = chunks_kernel(kernel_name(wdt, nt, chunks_mr(m), epi))
    args = (x, wd.w, wd.scale if wd.scale is not None else out,
            residual if residual is not None else np.uint64(0), out, s.part, s.counters,
            np.int32(m), np.int32(n_out(n_w, epi)), np.int32(k))
    launch(fn, (tiles, chunks, blocks) if blocks > 1 else (tiles, chunks), (THREADS,), args,
           pdl=pdl)
    return out
