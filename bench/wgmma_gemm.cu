// wgmma_gemm.cu (bench only, not routed): linear_mma.cu's tensor-core GEMM order on the
// warpgroup MMA. y[m, n] = scale[n] * sum_k x[m, k] * code[n, k] (+ residual[m, n] last),
// with the order cuda/linear_mma.cu states: K in 64-blocks; block c's value (lo + mid) + hi,
// three part accumulators from 0 over the block's four steps j ascending, step j's slots
// holding the same k as there (lane group t's slots 2t, 2t+1, 2t+8, 2t+9 hold k = 64 c +
// 16 t + 4 j + 0..3); total = 0 + b_0 + b_1 + ...; * scale; residual + that. If wgmma sums a
// step as mma.sync does (bench/wgmma_probe.py), these are linear_mma's bits.
//
// Why: linear_mma's warps issue ~630 instructions a 64-block besides their mmas (x's split,
// the codes' conversion, B fragments, one mma per 8 columns and part) and hold three part
// accumulators in registers (docs/throughput.md). Here one wgmma a part and step covers a
// warpgroup's 64 rows x BN columns, B comes from shared memory as bf16 (the weight's
// DeviceWeight.wb), and a warp splits each of its x values once per CTA.
//
// Layout: x f32 [M, K]; wb uint16 [N, K] (each int8 code's exact bf16); scale f32 [N]; y,
// residual f32 [M, N]. K % 64 == 0, N % BN == 0.
// Thread mapping: CTA = one warpgroup (128 threads) for rows 64 blockIdx.y .. + 63 and
// columns BN blockIdx.x .. + BN - 1; warp w holds rows 16 w .. 16 w + 15, lane = 4 g + t
// holds A (rows g, g + 8; slots 2t, 2t+1, 2t+8, 2t+9, mma.sync's m16n8k16 layout) and D
// (each 8-column group i: row g cols 8i + 2t, + 1; row g + 8 the same). Grid (N / BN,
// ceil(M / 64)).
// Shared memory: two buffers of a 64-block's codes (BN x 64 bf16 each), in wgmma's
// no-swizzle core matrices: step j's core matrix (kc, nc) (slots 8 kc .. 8 kc + 7 of columns
// 8 nc .. 8 nc + 7) at j * 32 BN + nc * 256 + kc * 128 bytes, a column's 8 slots a 16-byte
// row. `mode` says which descriptor field carries the 128 (0: leading, 1: stride), as the
// probe found. The next block's codes and x load into registers while this block's wgmmas
// run. No PDL, no prefetch rules: a first version to time against linear_mma.
#include <stdint.h>

#include "mma_common.cuh"

#include "wgmma_ops.cuh"

// A block's codes of the CTA's BN columns into a buffer: int4 h of column n holds the
// block's words 4h .. 4h + 3 (word w: codes 2w, 2w + 1), and word w = 8t + 2j + kc belongs
// to step j, core matrix kc, 4-byte slot pair t of column n's row.
template <int BN>
__device__ __forceinline__ void wg_load_codes(int4 (&q)[BN / 16], const uint16_t* wb, int n0,
                                              int K, int kb) {
#pragma unroll
    for (int r = 0; r < BN / 16; ++r) {
        const int i = threadIdx.x + 128 * r, n = i >> 3, h = i & 7;
        q[r] = __ldg(reinterpret_cast<const int4*>(wb + (size_t)(n0 + n) * K + kb) + h);
    }
}

template <int BN>
__device__ __forceinline__ void wg_store_codes(const int4 (&q)[BN / 16], unsigned* buf) {
#pragma unroll
    for (int r = 0; r < BN / 16; ++r) {
        const int i = threadIdx.x + 128 * r, n = i >> 3, h = i & 7;
        const int words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int w = 4 * h + e, t = w >> 3, j = (w & 7) >> 1, kc = w & 1;
            // bytes: j * 32 BN + (n / 8) * 256 + kc * 128 + (n % 8) * 16 + t * 4
            buf[j * 8 * BN + (n >> 3) * 64 + kc * 32 + (n & 7) * 4 + t] = (unsigned)words[e];
        }
    }
}

template <int BN>
__device__ __forceinline__ void wgmma_gemm_body(const float* __restrict__ x,
                                                const uint16_t* __restrict__ wb,
                                                const float* __restrict__ scale,
                                                const float* __restrict__ residual,
                                                float* __restrict__ y, int M, int N, int K,
                                                int mode) {
    __shared__ __align__(128) unsigned bufs[2][32 * BN];  // 2 x (BN x 64 bf16)
    constexpr int D = BN / 2;  // accumulator registers a thread, per part
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * BN, r0 = blockIdx.y * 64 + 16 * w + g, r1 = r0 + 8;
    const unsigned lbo = mode == 0 ? 128u : 256u, sbo = mode == 0 ? 256u : 128u;
    float part[3][D], total[D];
#pragma unroll
    for (int e = 0; e < D; ++e) total[e] = 0.0f;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 xv[4][2];
    auto load_x = [&](int kb) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = kb + 16 * t + 4 * j;
            xv[j][0] = r0 < M ? __ldg(reinterpret_cast<const float4*>(x + (size_t)r0 * K + k)) : zero4;
            xv[j][1] = r1 < M ? __ldg(reinterpret_cast<const float4*>(x + (size_t)r1 * K + k)) : zero4;
        }
    };
    int4 q[BN / 16];
    wg_load_codes<BN>(q, wb, n0, K, 0);
    wg_store_codes<BN>(q, bufs[0]);
    wg_proxy_fence();
    __syncthreads();
    load_x(0);
    for (int kb = 0, c = 0; kb < K; kb += 64, ++c) {
        unsigned a[4][3][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) cru_split_a(xv[j][0], xv[j][1], a[j]);
        const unsigned* buf = bufs[c & 1];
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint64_t desc = wg_desc(buf + j * 8 * BN, lbo, sbo);
#pragma unroll
            for (int s = 0; s < 3; ++s) wg_mma(part[s], a[j][s], desc, j > 0);
        }
        wg_commit();
        const bool more = kb + 64 < K;
        if (more) {  // in flight while the wgmmas run
            wg_load_codes<BN>(q, wb, n0, K, kb + 64);
            load_x(kb + 64);
        }
        wg_wait0();
#pragma unroll
        for (int e = 0; e < D; ++e)
            total[e] = __fadd_rn(total[e], __fadd_rn(__fadd_rn(part[2][e], part[1][e]), part[0][e]));
        if (more) {  // the other buffer was last read by block c - 1's wgmmas, all waited for
            wg_store_codes<BN>(q, bufs[(c + 1) & 1]);
            wg_proxy_fence();
            __syncthreads();
        }
    }
    wg_store_tile<BN>(total, y, residual, scale, r0, n0, t, M, N);
}

#ifndef CRU_HOST_SHIM
#define CRU_WGMMA_GEMM(BN)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) wgmma_gemm_##BN(                      \
        const float* x, const uint16_t* wb, const float* scale, const float* residual,      \
        float* y, int M, int N, int K, int mode) {                                          \
        wgmma_gemm_body<BN>(x, wb, scale, residual, y, M, N, K, mode);                      \
    }
CRU_WGMMA_GEMM(32)
CRU_WGMMA_GEMM(64)
#endif
