// wgmma_stage.cuh: what the wgmma GEMMs (linear_wgmma.cu, linear_wgmma_rows.cu) share about
// a 64-block: its copies into a shared-memory stage (cp.async; x's rows swizzled, the codes
// already in wgmma's core-matrix order, see linear_wgmma.cu's layout) and its value from a
// landed stage: x split into its three bf16 parts from shared memory, then the three part
// chains over the block's four steps (wgmma_ops.cuh), waited for. One warpgroup's work:
// tid is the thread's index in its warpgroup (0..127). No standard headers (NVRTC).
#pragma once
#include "mma_common.cuh"
#include "wgmma_ops.cuh"

#ifndef CRU_HOST_SHIM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
// dst (shared) = 16 bytes at src, or zeros when bytes == 0.
__device__ __forceinline__ void wp_cp16(void* dst, const void* src, int bytes) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void wp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
#endif

__device__ __forceinline__ int wp_swizzle(int r, int ch) {
    return (((ch & 7) ^ ((ch >> 3) << 1) ^ (r & 1)) & 7) | (ch & 8);
}

// Block c's x (64 rows x 16 chunks of 16 bytes) into a stage, by the warpgroup's thread tid.
__device__ __forceinline__ void wp_issue_x(float* xs, const float* x, int m0, int M, int K, int c,
                                           int tid) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int i = tid + 128 * r, row = i >> 4, ch = i & 15, gr = m0 + row;
        const float* src = x + (size_t)(gr < M ? gr : 0) * K + 64 * c + 4 * ch;
        wp_cp16(xs + row * 64 + 4 * wp_swizzle(row, ch), src, gr < M ? 16 : 0);
    }
}

// Block c's codes of the CTA's BN columns (BN / 8 groups x 64 pieces of 16 bytes): weight
// column groups n0 / 8 .. in order, or with EPI (the SwiGLU epilogue) the first half of the
// tile's groups from gate group n0 / 8 .. and the second half from up group `up8` .. (the
// gate/up weight's rows F + ...), so that gate column f and up column F + f sit in groups i
// and i + BN / 16 of the tile: the same D registers of two groups of one thread.
template <int BN, bool EPI = false>
__device__ __forceinline__ void wp_issue_codes(unsigned short* cs, const unsigned short* wp,
                                               int n0, int K, int c, int tid, int up8 = 0) {
    static_assert(BN % 16 == 0, "a thread copies BN / 16 pieces");
#pragma unroll
    for (int r = 0; r < BN / 16; ++r) {
        const int i = tid + 128 * r, nc = i >> 6, piece = i & 63;
        const int j = piece >> 4, kc = (piece >> 3) & 1, row = piece & 7;
        const int grp = EPI && nc >= BN / 16 ? up8 + nc - BN / 16 : n0 / 8 + nc;
        const unsigned short* src = wp + ((size_t)grp * (K / 64) + c) * 512 + piece * 8;
        wp_cp16(cs + j * 16 * BN + nc * 128 + kc * 64 + row * 8, src, 16);
    }
}

// The three part values of a block for the warpgroup's 64 rows x BN columns (D's layout): x
// from the landed stage xs (the thread's rows l0 and l0 + 8 of the tile), the codes from cs.
template <int BN>
__device__ __forceinline__ void wg_block_value(const float* xs, const unsigned short* cs, int l0,
                                               int t, unsigned lbo, unsigned sbo,
                                               float (&part)[3][BN / 2]) {
    const int l1 = l0 + 8;
    unsigned a[4][3][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float4 v0 = *reinterpret_cast<const float4*>(xs + l0 * 64 + 4 * wp_swizzle(l0, 4 * t + j));
        const float4 v1 = *reinterpret_cast<const float4*>(xs + l1 * 64 + 4 * wp_swizzle(l1, 4 * t + j));
        cru_split_a(v0, v1, a[j]);
    }
    wg_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const unsigned long long desc = wg_desc(cs + j * 16 * BN, lbo, sbo);
#pragma unroll
        for (int s = 0; s < 3; ++s) wg_mma(part[s], a[j][s], desc, j > 0);
    }
    wg_commit();
    wg_wait0();
}

// A block's value at element e of the thread's D: (lo + mid) + hi, as linear_mma.cu's
// cru_block_add forms it (without its running total: the callers add it to theirs).
template <int D>
__device__ __forceinline__ float wg_block_sum(const float (&part)[3][D], int e) {
    return __fadd_rn(__fadd_rn(part[2][e], part[1][e]), part[0][e]);
}
