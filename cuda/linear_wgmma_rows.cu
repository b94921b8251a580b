// linear_wgmma_rows.cu: linear_mma.cu's tensor-core GEMM order on the warpgroup MMA for
// few rows (a decode step's 16-128): y[m, n] = scale[n] * sum_k x[m, k] * code[n, k]
// (+ residual[m, n] last). Not routed unless CRUCIBLE_WGMMA=1 (kernels/linear_wgmma.py).
//
// Why: at 64 rows linear_wgmma.cu's grid is N / BN CTAs, each walking all of K in series
// (down: 24 blocks), so the step waits on one warpgroup's chain of loads. Here W warpgroups
// a CTA take the K blocks in turn (warpgroup w: c = w, w + W, ...), as linear_mma_rows.cu
// spreads them over warps: each leaves its blocks' values in shared memory, and once every
// warpgroup is done the CTA adds them from the first, which is the order's total. Same
// blocks, steps, slots, parts and sums as linear_mma.cu (linear_wgmma.cu states them), so
// the same bits where wgmma sums a step as mma.sync does.
//
// Layout: as linear_wgmma.cu (x f32 [M, K]; wp the codes in wgmma's shared-memory order,
// DeviceWeight.wg; scale f32 [N]; y, residual f32 [M, N]); K % 64 == 0, N % BN == 0.
// Thread mapping: CTA = W warpgroups (128 W threads) for rows 64 blockIdx.y .. + 63 and
// columns BN blockIdx.x .. + BN - 1; warpgroup w computes the value of each of its blocks
// for all 64 x BN outputs (wgmma_ops.cuh's D layout), then thread i of the CTA finishes
// outputs i, i + 128 W, ... (row-major in the tile). Grid (N / BN, ceil(M / 64)).
// Dynamic shared memory: W x 2 stages (x's 64 x 64 block, the codes' BN x 64: 16384 + 128 BN
// bytes each, wgmma_stage.cuh), then the block values [K / 64][64][BN] f32. A warpgroup
// refills a stage only after its own barrier at the end of the block that read it; the
// finisher starts after a CTA barrier. PDL: each warpgroup's first block's codes load before
// cru_pdl_wait; x and the residual after it.
#include "mma_common.cuh"
#include "pdl.cuh"
#include "wgmma_stage.cuh"

#ifndef CRU_HOST_SHIM
// Barrier of warpgroup w's 128 threads alone (named barrier 1 + w; 0 is __syncthreads').
// Immediate ids, so that ptxas reserves four barriers, not all sixteen.
__device__ __forceinline__ void wg_bar(int w) {
    if (w == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
    else if (w == 1) asm volatile("bar.sync 2, 128;" ::: "memory");
    else asm volatile("bar.sync 3, 128;" ::: "memory");
}
#endif

template <int BN, int W>  // W <= 3 (wg_bar's ids)
__device__ __forceinline__ void linear_wgmma_rows_body(const float* __restrict__ x,
                                                       const unsigned short* __restrict__ wp,
                                                       const float* __restrict__ scale,
                                                       const float* __restrict__ residual,
                                                       float* __restrict__ y, int M, int N,
                                                       int K, int mode) {
    CRU_DYNAMIC_SMEM(float4, wr_smem4);
    constexpr int XS = 64 * 64, CS = BN * 64, STAGE = XS + CS / 2;  // floats a stage
    constexpr int D = BN / 2;
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3, l0 = 16 * w + g;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * 64, nblocks = K / 64;
    const unsigned lbo = mode == 0 ? 128u : 256u, sbo = mode == 0 ? 256u : 128u;
    float* stages = reinterpret_cast<float*>(wr_smem4) + wg * 2 * STAGE;
    float* bv = reinterpret_cast<float*>(wr_smem4) + W * 2 * STAGE;  // [nblocks][64][BN]
    auto xs = [&](int s) { return stages + s * STAGE; };
    auto cs = [&](int s) { return reinterpret_cast<unsigned short*>(stages + s * STAGE + XS); };
    if (wg < nblocks) wp_issue_codes<BN>(cs(0), wp, n0, K, wg, tid);  // weights: before the wait
    cru_pdl_wait();
    cru_pdl_trigger();
    if (wg < nblocks) wp_issue_x(xs(0), x, m0, M, K, wg, tid);
    wp_commit();
    float part[3][D];
    for (int i = 0, c = wg; c < nblocks; ++i, c += W) {
        if (c + W < nblocks) {  // the next block, into the stage block c - W read
            wp_issue_codes<BN>(cs((i + 1) & 1), wp, n0, K, c + W, tid);
            wp_issue_x(xs((i + 1) & 1), x, m0, M, K, c + W, tid);
        }
        wp_commit();
        wp_wait<1>();  // block c's copies (this thread's) have landed
        wg_proxy_fence();
        wg_bar(wg);    // ... and the warpgroup's
        wg_block_value<BN>(xs(i & 1), cs(i & 1), l0, t, lbo, sbo, part);
        float* out = bv + (size_t)c * 64 * BN;
#pragma unroll
        for (int q = 0; q < BN / 8; ++q)
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // rows l0 and l0 + 8, columns 8 q + 2 t, + 1
                const int d = 4 * q + 2 * h;
                *reinterpret_cast<float2*>(out + (l0 + 8 * h) * BN + 8 * q + 2 * t) =
                    make_float2(wg_block_sum(part, d), wg_block_sum(part, d + 1));
            }
        wg_bar(wg);  // every thread of the warpgroup is done with stage i & 1
    }
    __syncthreads();  // every warpgroup's block values are in
    for (int i = threadIdx.x; i < 64 * BN; i += 128 * W) {
        const int row = i / BN, col = i % BN, gr = m0 + row, gc = n0 + col;
        if (gr >= M) continue;
        float total = 0.0f;
        for (int c = 0; c < nblocks; ++c) total = __fadd_rn(total, bv[((size_t)c * 64 + row) * BN + col]);
        float v = __fmul_rn(total, scale[gc]);  // linear_mma's store: scale, then the residual
        if (residual) v = __fadd_rn(residual[(size_t)gr * N + gc], v);
        y[(size_t)gr * N + gc] = v;
    }
}

#ifndef CRU_HOST_SHIM
// The forms kernels/linear_wgmma.py launches: linear_wgmma_rows_<BN>_<W>, dynamic shared
// memory 2 W (16384 + 128 BN) + 256 BN K / 64 bytes.
#define CRU_LINEAR_WGMMA_ROWS(BN, W)                                                        \
    extern "C" __global__ void __launch_bounds__(128 * W) linear_wgmma_rows_##BN##_##W(     \
        const float* x, const unsigned short* wp, const float* scale, const float* residual, \
        float* y, int M, int N, int K, int mode) {                                          \
        linear_wgmma_rows_body<BN, W>(x, wp, scale, residual, y, M, N, K, mode);            \
    }
CRU_LINEAR_WGMMA_ROWS(16, 3)
CRU_LINEAR_WGMMA_ROWS(16, 2)
#endif
