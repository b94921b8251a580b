// mma_row.cuh: one row's block values in the tensor-core GEMM order (linear_mma.cu states
// it), for the kernels of the batch-1 decode stack under CRUCIBLE_GEMM=mma.
//
// Why: the stack hands a GEMM's per-64-block partials from one kernel to the next and adds
// them there in ascending block order (rows_chunk.cuh's cru_combined, decode_mlp's
// finisher). In linear.cu's order a partial is a 64-long fma chain; in the mma order it is
// the block value b_c = 0 + ((lo_c + mid_c) + hi_c), exactly what linear_mma_rows.cu
// stores to shared memory before its finisher adds the blocks from 0. So a kernel that
// computes b_c with the same four mma steps (the same k in the same slots) and leaves it
// where the fma stack leaves its chain gives the unfused mma layer's bits.
//
// Fragment use (mma_common.cuh's layout, lane = 4 g + t): the one real row is mma row 0,
// fed by lanes g == 0 (rows 1..15 are zeros, as linear_mma_rows' rows past M); lane t
// feeds k = 16 t + 4 j .. + 3 at step j, with column g's codes of the same k (one int4:
// the 16 codes 16 t .. 16 t + 15 of the block). Lanes 0..3 receive columns 2 t, 2 t + 1.
// No standard headers (NVRTC).
#pragma once
#include "mma_common.cuh"

// The block value of the row against one 8-column tile (q: this lane's int4 of column g's
// codes, k = 16 t .. 16 t + 15 of the block), as linear_mma_rows stores it (from 0).
// x64: the row's 64 values of the block (shared memory, 16-byte aligned); lanes g == 0
// feed x64[16 t + 4 j .. + 3] at step j, the others zeros. Each step reads its four values
// afresh (shared loads are cheap, registers are not: the stack's kernels run near their
// bounds). Meaningful in lanes 0..3: columns 2 t (x) and 2 t + 1 (y) of the tile.
template <bool ONE_ACC>
__device__ __forceinline__ float2 cru_row_block(const float* x64, int lane, int4 q) {
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4* x4 = reinterpret_cast<const float4*>(x64 + 16 * (lane & 3));
    const bool feeds = (lane >> 2) == 0;
    float p[3][4];
#pragma unroll
    for (int s = 0; s < 3; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[s][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        unsigned a[3][4], b[2];
        cru_split_a(feeds ? x4[j] : zero4, zero4, a);
        cru_codes_b(cru_word(q, j), b);
        cru_mma3<ONE_ACC>(p, a, b);
    }
    const float b0 = cru_block_add<ONE_ACC>(0.0f, p, 0);
    return make_float2(b0, cru_block_add<ONE_ACC>(0.0f, p, 1));
}

// The block values of the row against tiles tile0, tile0 + tstep, ... < n_cols / 8 of a
// staged slice (rows_chunk.cuh's piece-major cru_stage_slice layout: piece p of column n
// at int4 slot p * n_cols + n; int8 codes, so 4 pieces of 16), written as float2 pairs to
// out[8 tile + 2 t]. x64: the row's 64 values of the slice's block.
__device__ __forceinline__ void cru_row_slice(const int4* slice, int n_cols, const float* x64,
                                              float* out, int tile0, int tstep, int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int tile = tile0; tile < n_cols / 8; tile += tstep) {
        const float2 b = cru_row_block<false>(x64, lane, slice[t * n_cols + 8 * tile + g]);
        if (g == 0) *reinterpret_cast<float2*>(out + 8 * tile + 2 * t) = b;
    }
}

// Eight tiles' block values (64 columns: a head's, or 32 gate and 32 up columns) of the row
// against the codes a lane holds in raw[n / 4].v[n % 4] (tile n, RawChunk's int4s), to
// out[32 j + l] for column 32 j + l of the 64: where the fma forms leave their chains
// (column l of half j). x64: the row's 64 values of the block.
template <typename Raw>
__device__ __forceinline__ void cru_row_tiles8(const Raw (&raw)[2], const float* x64,
                                               float* out, int lane) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const float2 b = cru_row_block<false>(x64, lane, raw[n >> 2].v[n & 3]);
        if ((lane >> 2) == 0)  // column 8 n + 2 t and its pair: 32 (n / 4) + 8 (n % 4) + 2 t
            *reinterpret_cast<float2*>(out + 8 * n + 2 * (lane & 3)) = b;
    }
}
