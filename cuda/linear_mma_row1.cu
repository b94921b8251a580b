// linear_mma_row1.cu: the tensor-core int8 GEMM of linear_mma.cu for one row (a batch-1
// decode step's LM head), same bits: linear_mma.cu states the order (block values b_c =
// 0 + ((lo_c + mid_c) + hi_c) from three part chains, total = 0 + b_0 + b_1 + ...
// ascending, times scale, residual last).
//
// Why: linear_mma_rows puts x in the mma's A operand, so one row leaves 15 of its 16 rows
// idle, and the LM head (49,152 x 576) ran at 23 us against 12.9 for linear.cu's row kernel
// on the H200. Here the weights are A and the row's three bf16 parts B's columns
// (mma_row.cuh, the decode stack's form): one m16n8k16 step serves 16 columns and all three
// parts.
//
// NORM (the RMSNorm prologue): x is normalised on the way in, x * inv * norm_w with inv
// from rowops.cuh's canonical tree, the values rmsnorm_rows writes (as linear_mma_rows'
// NORM), so fused == rmsnorm_rows then this kernel, bit for bit.
//
// Layout: x f32 [1, K]; w int8 [N, K]; scale f32 [N]; residual, y f32 [1, N]; norm_w f32
// [K]. K % 64 == 0, N % 16 == 0, 16-byte aligned rows.
// Thread mapping: warp w of CTA b owns the column pair p = 8 b + w (columns 16 p .. 16 p +
// 15; lane 4 g + t holds columns 16 p + g and 16 p + 8 + g, k = 64 c + 16 t .. + 15 of
// block c) and adds its block values in ascending c as it goes; lanes t == 0 hold the
// totals. The CTA first splits the row (normalised under NORM) once into shared memory as
// B fragments (cru_row_b_put: 96 words a block), which every warp then loads.
// PDL (pdl.cuh): each warp's codes of its first PB blocks load before cru_pdl_wait (all of
// them at K <= 64 PB; the rest stream after it); x, norm_w's use and the residual after.
// Shared memory (dynamic): unsigned bw[K / 64][96]; static: the norm's 8 partials and inv.
// No standard headers (NVRTC).
#include "mma_row.cuh"
#include "pdl.cuh"
#include "rowops.cuh"

#ifndef CRU_DYNAMIC_SMEM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

// Block c's values of the warp's column pair added to its running totals, in ascending c.
__device__ __forceinline__ void cru_row1_add(float2& tot, const unsigned* bw_c, int lane,
                                             int4 qa, int4 qb) {
    unsigned b[4][2];
    cru_row_b_get(bw_c, lane, b);
    const float2 v = cru_row_pair(b, qa, qb);
    tot.x = __fadd_rn(tot.x, v.x);
    tot.y = __fadd_rn(tot.y, v.y);
}

template <int PB, bool NORM>
__global__ void __launch_bounds__(256)
linear_mma_row1(const float* __restrict__ x, const signed char* __restrict__ w,
                const float* __restrict__ scale, const float* __restrict__ residual,
                float* __restrict__ y, int N, int K, const float* __restrict__ norm_w,
                float eps) {
    CRU_DYNAMIC_SMEM(uint4, bw4);  // uint4: 16-byte aligned for cru_row_b_get
    unsigned* bw = reinterpret_cast<unsigned*>(bw4);
    __shared__ float red[8];
    __shared__ float inv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, nb = K >> 6;
    const int pair = blockIdx.x * (blockDim.x >> 5) + warp;
    const bool live = pair < (N >> 4);  // warp-uniform
    const signed char* wa = w + (size_t)(16 * (live ? pair : 0) + g) * K + 16 * t;
    const signed char* wb = wa + (size_t)8 * K;
    int4 qa[PB], qb[PB];
#pragma unroll
    for (int c = 0; c < PB; ++c)  // weights, never written by a step (pdl.cuh)
        if (c < nb) {
            qa[c] = __ldg(reinterpret_cast<const int4*>(wa + 64 * c));
            qb[c] = __ldg(reinterpret_cast<const int4*>(wb + 64 * c));
        }
    cru_pdl_wait();
    cru_pdl_trigger();
    if (NORM) {
        cru_rows_sumsq(x, 1, K, red);
        if (threadIdx.x == 0) inv = cru_inv_rms(cru_rows_total(red, 0), K, eps);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        if (NORM) {
            x0 = cru_norm_apply(x0, inv, norm_w[2 * i]);
            x1 = cru_norm_apply(x1, inv, norm_w[2 * i + 1]);
        }
        cru_row_b_put(bw + 96 * (i >> 5), i & 31, x0, x1);
    }
    __syncthreads();
    if (!live) return;
    float2 tot = make_float2(0.0f, 0.0f);  // columns 16 p + g, 16 p + 8 + g (lanes t == 0)
#pragma unroll
    for (int c = 0; c < PB; ++c)
        if (c < nb) cru_row1_add(tot, bw + 96 * c, lane, qa[c], qb[c]);
    for (int c = PB; c < nb; ++c)
        cru_row1_add(tot, bw + 96 * c, lane, __ldg(reinterpret_cast<const int4*>(wa + 64 * c)),
                     __ldg(reinterpret_cast<const int4*>(wb + 64 * c)));
    if (t == 0) {
        const int na = 16 * pair + g, nb8 = na + 8;
        float va = __fmul_rn(tot.x, scale[na]), vb = __fmul_rn(tot.y, scale[nb8]);
        if (residual) {
            va = __fadd_rn(residual[na], va);
            vb = __fadd_rn(residual[nb8], vb);
        }
        y[na] = va;
        y[nb8] = vb;
    }
}

#ifndef __CUDACC_RTC__  // offline nvcc (tests/test_attention_nvcc.py): the forms linear_mma.py builds
#define CRU_ROW1(PB, NORM)                                                                      \
    template __global__ void linear_mma_row1<PB, NORM>(const float*, const signed char*,      \
                                                       const float*, const float*, float*, int, \
                                                       int, const float*, float);
CRU_ROW1(9, false)
CRU_ROW1(9, true)
CRU_ROW1(2, false)
CRU_ROW1(2, true)
#undef CRU_ROW1
#endif
