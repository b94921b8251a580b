"""What a backend is built with: plain values, decided once by the settings at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from crucible.kernels.variants import DEFAULT_VARIANT

# What mixed_graph_rows may be: the mixed graphs' row buckets from 128 (cupy_mixed_graphs).
MIXED_GRAPH_ROWS = (128, 192, 256, 384, 512, 640, 768, 1024, 1280, 1536, 2048)
# The largest decode step a CUDA graph replays (cupy_graphs.BUCKETS' last): past it a
# decode step launches eagerly, ~9 ms of host launches at hundreds of rows.
DECODE_GRAPH_ROWS = 512
# The int8 GEMMs' order: linear.cu's fma chains on the CUDA cores, or linear_mma.cu's exact
# bf16-part products on the tensor cores. One order for every GEMM of a backend.
GEMMS = ("fma", "mma")


@dataclass(frozen=True)
class BackendOptions:
    attention: str = DEFAULT_VARIANT  # attention variant name (kernels/variants.py); CuPy
    decode_graphs: bool = True  # decode steps replay CUDA graphs
    prefill_graphs: bool = True  # singleton prefills replay CUDA graphs
    mixed_graphs: bool = True  # mixed steps (prefill slices + decodes) replay CUDA graphs
    mixed_graph_rows: int = 512  # the largest mixed step a graph replays (cupy_mixed_graphs)
    pdl: bool = True  # programmatic dependent launch inside decode graphs
    attention_fork: bool = True  # mixed steps' two attention launches on two streams
    longest_first: bool = True  # decode graphs list attn_decode's rows longest first
    decode_stack: bool = True  # batch-1 decode as three kernels per layer (same bits)
    gemm: str = "fma"  # int8 GEMMs' order, one of GEMMS (mma: no fused row kernels, no stack)
    wgmma: bool | None = False  # mma's large GEMMs on the warpgroup MMA; None: where it runs
    cpu_threads: int | None = None  # the CPU kernels' threads (None: the available cores)
