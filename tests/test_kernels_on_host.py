"""Kernels' own CUDA sources run on the CPU (tests/cuda_host/prelude.h maps the CUDA they
use onto std::thread and std::barrier, warp shuffles included), each against a plain
spelling of the canonical order, bitwise, with a negative control that adds the chunk
partials in descending order and must fail exactly the runs that can tell. This checks the
kernels' index arithmetic without a GPU; the GPU's side (fences, L2 reads, cp.async, PDL,
whole steps) is gpu-engine-check's.

- cuda/linear_chunks.cu (chunks_driver.cpp): every instantiation over shapes with N and K
  tails and M = 1..64, and M = 65..192 in row blocks of 64, 720 runs. One or two chunks add
  the same either way (a + b == b + a); the 144 runs of the three-chunk shape (K = 192)
  must fail.
- cuda/decode_stack.cu (stack_driver.cpp: decode_mlp, combine_rows) against the five-kernel
  layer's order: h = x + O's partials (O's residual epilogue), the canonical RMSNorm tree,
  gate/up, SwiGLU, down's chunk partials and their ascending combine; f32 and int8, several
  hidden and FFN sizes, 1 and 2 rows, 0-9 O partials, 96 runs. 0 or 1 partials add the same
  either way; the 48 runs with 3 or 9 must fail.
- cuda/linear_mma.cu, linear_mma_rows.cu and linear_mma_row1.cu (mma_driver.cpp) against
  a plain spelling of the tensor-core order: every tile and rows form, M = 1..40, two and
  three K blocks, the residual on and off, then the fused rows forms (RMSNorm prologue
  against rowops_ref.h's tree, with and without the SwiGLU epilogue, and the epilogue
  alone), then the one-row form (every block loaded before the wait, or the third
  streamed; the residual; the RMSNorm prologue), 72 runs (the tile forms with and without
  their loads a block ahead); the mma is prelude.h's stand-in
  sum (c + exact products in double, rounded once), the same in kernel and reference, so
  this checks fragments, blocks, tiles, prologues and epilogues, not the tensor core. The
  45 runs with three blocks must fail with the block values added in descending order.
  The reference's block value is mma_ref.h's, which the two drivers below share.
- cuda/decode_stack.cu's MMA form, decode_mlp<signed char, true> (mma_stack_driver.cpp),
  against the mma order: h = x + O's partials, the RMSNorm tree, gate/up as block values
  added from the first, SwiGLU, down's partials as block values, combine_rows of them; int8,
  (K, F) = (64, 128), (192, 256), (576, 128), 1 and 2 rows, 0-9 O partials, 24 runs. The
  control adds O's partials and gate/up's blocks in descending order: the 20 runs with 3 or
  more of either must fail.
- cuda/linear_rows.cu's MMA form, linear_rows<signed char, 1, 1, 2, true>
  (mma_qkv_driver.cpp): RMSNorm, the QKV heads as block values,
  RoPE, q out and K/V into small pools, with no prologue, the combine of 1 or 3 partials,
  or the gather; K 64 / 192 / 576, 1 and 2 rows, 1 or 3 heads per CTA, 24 runs. The 18 runs
  with 3 or more partials or blocks must fail in descending order.
- cuda/attention_decode.cu (decode_attn_driver.cpp) against a plain spelling of the
  reference attention order (the QK butterfly tree, which the kernel builds from eight
  threads a key, the softmax's 256-thread sums, the ascending PV chain): attn_decode<1, 0> and <3, 0> over 9 query heads and 3 KV heads,
  histories of 1 to 700 positions around the QK sweep and V tile edges, shuffled pages,
  empty entries that must stay unwritten; then the decode stack's forms, whose O chunk
  partials (f32 and int8 W_o as fma chains, int8 as mma_ref.h's block values) are checked
  too, on four of the rows; then the RoPE-in form (attn_decode<3, 0, false, true>: raw
  QKV rows in, the pools' position n - 1 starting as a sentinel) against rope_store's
  rotation and placement and the reference over the rotated rows; 63 runs; exp is the
  library's in kernel and reference alike. The 54 runs of two positions or more must fail
  with the PV chain run descending.
- cuda/attention.cu's exact tiled family (prefill_attn_driver.cpp), q4-k64, q2-k32, q1-k16,
  q4-k64 with the page-table cache and q4-k64's prefetching instance, over seven packed
  segments (prefill chunks of 4-70 rows starting at 0, 5, 100, 127; decode rows), against
  the same reference (attn_ref.h), 35 runs; the 30 whose rows have two positions or more
  must fail descending.
- cuda/linear_wgmma.cu, linear_wgmma_rows.cu and bench/wgmma_gemm.cu (wgmma_driver.cpp; the
  tensor-core order on the warpgroup MMA, routed only under CRUCIBLE_WGMMA=1, timed by
  bench/wgmma_gemm.py) against
  mma_ref.h's spelling of that order, with wgmma_host.h's stand-ins for the warpgroup MMA
  (the descriptor read as the kernels' mode 0) and cp.async (copies at once): wgmma_gemm at
  BN 32 and 64, linear_wgmma at (16, 4), (32, 3), (32, 4) and (64, 3) stages and its SwiGLU
  epilogue at (32, 3) and (64, 3), linear_wgmma_rows at 3 and 2 warpgroups taking the K
  blocks in turn, M = 1..100 over one and two 64-row tiles, K of one to three blocks (and
  seven for the rows kernel), the residual on and off, 312 runs; the 112 with three or
  seven blocks must fail descending.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from host_driver import build, run

# driver: (runs, runs that fail with the partials added in descending order)
CASES = {"chunks_driver.cpp": (720, 144), "stack_driver.cpp": (144, 96),
         "mma_driver.cpp": (80, 49), "mma_stack_driver.cpp": (36, 30),
         "mma_qkv_driver.cpp": (24, 18), "decode_attn_driver.cpp": (63, 54),
         "prefill_attn_driver.cpp": (35, 30), "wgmma_driver.cpp": (312, 112)}


@pytest.fixture(scope="module", params=sorted(CASES))
def driver(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = request.param
    return name, build(name, tmp_path_factory.mktemp(Path(name).stem))


def test_kernel_source_on_host_matches_the_canonical_order(driver: tuple[str, Path]) -> None:
    name, exe = driver
    rc, runs, failed, out = run(exe)
    assert rc == 0 and runs == CASES[name][0] and failed == 0, out[-3000:]


def test_negative_control_descending_partials_differ(driver: tuple[str, Path]) -> None:
    name, exe = driver
    rc, runs, failed, out = run(exe, "descending")
    assert rc == 1 and (runs, failed) == CASES[name], out[-3000:]
