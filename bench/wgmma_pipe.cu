// wgmma_pipe.cu (bench only, not routed): bench/wgmma_gemm.cu's kernel (linear_mma.cu's
// order on the warpgroup MMA: same blocks, steps, slots, parts and sums, so the same bits)
// with its loads through a cp.async pipeline of S stages instead of registers.
//
// Why: wgmma_gemm.cu holds the next block's x and codes in registers (48 a thread) while a
// block's wgmmas run, and can only look one block ahead; a 64-block's twelve wgmmas are a
// few hundred cycles, shorter than a load from L2 or DRAM. Here S - 1 blocks are in flight
// in shared memory, and the registers hold only the accumulators and a block's A.
//
// Layout: x f32 [M, K]; wp: the codes as bf16 pre-permuted into the shared-memory image
// wgmma reads (host: bench/wgmma_gemm.py codes_wgmma), [N / 8][K / 64][step j][core
// kc][column row][8 slots] so that each 16-byte piece is one core-matrix row: element
// (nc, c, j, kc, r, p) = code[8 nc + r][64 c + 16 (p / 2) + 4 j + p % 2 + 2 kc]. scale f32
// [N]; y, residual f32 [M, N]. K % 64 == 0, N % BN == 0.
// Thread mapping: as wgmma_gemm.cu (one warpgroup a CTA, 64 rows x BN columns; warp w rows
// 16 w ..; lane 4 g + t). Grid (N / BN, ceil(M / 64)).
// Dynamic shared memory, S stages of: x's 64 x 64 block (16 KB; row r's 16-byte chunk ch
// at chunk ((ch & 7) ^ ((ch >> 3) << 1) ^ (r & 1)) | (ch & 8), so that the split's float4
// reads, chunks 4 t + j of rows g and g + 1 in a quarter warp, hit eight distinct bank
// groups), then the codes' BN x 64 bf16 in wgmma_gemm.cu's core-matrix layout (step j at
// j * 32 BN bytes, column group nc at nc * 256, kc at 128). Rows past M load as zeros.
// Stage s is refilled with block c + S - 1 only after every thread passed block c - 1's
// wgmma wait (the barrier at the top of block c).
#include <stdint.h>

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

template <int BN>
__device__ __forceinline__ void wp_issue(float* xs, uint16_t* cs, const float* x,
                                         const uint16_t* wp, int m0, int n0, int M, int K,
                                         int c) {
    const int nblocks = K / 64;
#pragma unroll
    for (int r = 0; r < 8; ++r) {  // x: 64 rows x 16 chunks
        const int i = threadIdx.x + 128 * r, row = i >> 4, ch = i & 15, gr = m0 + row;
        const float* src = x + (size_t)(gr < M ? gr : 0) * K + 64 * c + 4 * ch;
        wp_cp16(xs + row * 64 + 4 * wp_swizzle(row, ch), src, gr < M ? 16 : 0);
    }
#pragma unroll
    for (int r = 0; r < BN / 16; ++r) {  // codes: BN / 8 groups x 64 pieces
        const int i = threadIdx.x + 128 * r, nc = i >> 6, piece = i & 63;
        const int j = piece >> 4, kc = (piece >> 3) & 1, row = piece & 7;
        const uint16_t* src = wp + ((size_t)(n0 / 8 + nc) * nblocks + c) * 512 + piece * 8;
        wp_cp16(cs + j * 16 * BN + nc * 128 + kc * 64 + row * 8, src, 16);
    }
}

template <int BN, int S>
__device__ __forceinline__ void wgmma_pipe_body(const float* __restrict__ x,
                                                const uint16_t* __restrict__ wp,
                                                const float* __restrict__ scale,
                                                const float* __restrict__ residual,
                                                float* __restrict__ y, int M, int N, int K,
                                                int mode) {
    CRU_DYNAMIC_SMEM(float4, wp_smem4);
    constexpr int XS = 64 * 64, CS = BN * 64;  // floats, bf16 a stage
    float* xs0 = reinterpret_cast<float*>(wp_smem4);
    uint16_t* cs0 = reinterpret_cast<uint16_t*>(xs0 + S * XS);
    constexpr int D = BN / 2;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * 64, nblocks = K / 64;
    const int l0 = 16 * w + g, l1 = l0 + 8;  // the thread's rows in the tile
    const unsigned lbo = mode == 0 ? 128u : 256u, sbo = mode == 0 ? 256u : 128u;
    float part[3][D], total[D];
#pragma unroll
    for (int e = 0; e < D; ++e) total[e] = 0.0f;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < nblocks) wp_issue<BN>(xs0 + s * XS, cs0 + s * CS, x, wp, m0, n0, M, K, s);
        wp_commit();
    }
    for (int c = 0; c < nblocks; ++c) {
        wp_wait<S - 2>();  // block c's stage has landed (this thread's copies)
        wg_proxy_fence();
        __syncthreads();   // ... and every thread's; block c - 1's stage is free again
        const int next = c + S - 1, st = c % S;
        if (next < nblocks)
            wp_issue<BN>(xs0 + (next % S) * XS, cs0 + (next % S) * CS, x, wp, m0, n0, M, K, next);
        wp_commit();
        const float* xs = xs0 + st * XS;
        unsigned a[4][3][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float4 v0 = *reinterpret_cast<const float4*>(xs + l0 * 64 + 4 * wp_swizzle(l0, 4 * t + j));
            const float4 v1 = *reinterpret_cast<const float4*>(xs + l1 * 64 + 4 * wp_swizzle(l1, 4 * t + j));
            cru_split_a(v0, v1, a[j]);
        }
        const uint16_t* cs = cs0 + st * CS;
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint64_t desc = wg_desc(cs + j * 16 * BN, lbo, sbo);
#pragma unroll
            for (int s = 0; s < 3; ++s) wg_mma(part[s], a[j][s], desc, j > 0);
        }
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int e = 0; e < D; ++e)
            total[e] = __fadd_rn(total[e], __fadd_rn(__fadd_rn(part[2][e], part[1][e]), part[0][e]));
    }
    wg_store_tile<BN>(total, y, residual, scale, m0 + l0, n0, t, M, N);
}

// Dynamic shared memory bytes of a launch.
#define WP_SMEM(BN, S) ((S) * (64 * 64 * 4 + (BN) * 64 * 2))

#ifndef CRU_HOST_SHIM
#define CRU_WGMMA_PIPE(BN, S)                                                               \
    extern "C" __global__ void __launch_bounds__(128) wgmma_pipe_##BN##_##S(                \
        const float* x, const uint16_t* wp, const float* scale, const float* residual,      \
        float* y, int M, int N, int K, int mode) {                                          \
        wgmma_pipe_body<BN, S>(x, wp, scale, residual, y, M, N, K, mode);                   \
    }
CRU_WGMMA_PIPE(32, 3)
CRU_WGMMA_PIPE(32, 4)
CRU_WGMMA_PIPE(64, 3)
#endif
