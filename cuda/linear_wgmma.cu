// linear_wgmma.cu: linear_mma.cu's tensor-core GEMM order on the warpgroup MMA (wgmma,
// sm_90a), for large M: y[m, n] = scale[n] * sum_k x[m, k] * code[n, k] (+ residual[m, n]
// last). Routed for large M where CRUCIBLE_WGMMA allows (kernels/linear_wgmma.py, ROUTE):
// its bits equal linear_mma's on the GPU (bench/wgmma_probe.py, bench/wgmma_gemm.py).
//
// The order is linear_mma.cu's, step for step: K in 64-blocks; block c's value (lo + mid) +
// hi, three part accumulators over the block's four steps j ascending, step j's slots
// holding the same k as there (lane group t's slots 2t, 2t+1, 2t+8, 2t+9 hold k = 64 c +
// 16 t + 4 j + 0..3); total = 0 + b_0 + b_1 + ...; * scale; residual + that. A part's chain
// starts with wgmma's scale-d 0 instead of adding to +0, which can only change the sign of
// an exactly-zero part, and the block sums remove that (wgmma_ops.cuh). So it gives
// linear_mma's bits wherever wgmma sums a step as mma.sync does.
//
// Why: linear_mma's warps issue ~630 instructions a 64-block besides their mmas (x's split,
// the codes' conversion, B fragments, an mma per 8 columns and part) and hold three part
// accumulators in registers (docs/throughput.md: occupancy-bound). Here one wgmma a part and
// step covers a warpgroup's 64 rows x BN columns, B is read from shared memory, and the
// loads run S - 1 blocks ahead through cp.async, in no registers.
//
// Layout: x f32 [M, K]; wp: the codes as bf16, pre-permuted into the shared-memory image
// wgmma reads (DeviceWeight.wg, kernels/device_weight.py codes_wgmma), [N / 8][K / 64][step
// j][core kc][column r][8 slots], so that each 16-byte piece is one core-matrix row: element
// (nc, c, j, kc, r, p) = code[8 nc + r][64 c + 16 (p / 2) + 4 j + p % 2 + 2 kc]. scale f32
// [N]; y, residual f32 [M, N]. K % 64 == 0, N % BN == 0 (the host checks).
// Thread mapping: CTA = one warpgroup (128 threads), rows 64 blockIdx.y .. + 63, columns BN
// (16, 32 or 64) blockIdx.x .. + BN - 1; warp w holds rows 16 w .. 16 w + 15, lane = 4 g + t holds A (rows
// g, g + 8) and D as wgmma_ops.cuh states. Grid (N / BN, ceil(M / 64)).
// Dynamic shared memory, S stages of: x's 64 x 64 block (16 KB; row r's 16-byte chunk ch at
// chunk ((ch & 7) ^ ((ch >> 3) << 1) ^ (r & 1)) | (ch & 8), so that the split's float4 reads,
// chunks 4 t + j of rows g and g + 1 in a quarter warp, hit eight distinct bank groups), then
// the codes' BN x 64 bf16 in core matrices (step j at j * 32 BN bytes, column group nc at
// nc * 256, kc at 128: descriptor leading offset 128, stride 256; `mode` 1 swaps the two
// fields, for bench/wgmma_gemm.py to find the reading the hardware uses). Rows past M load
// as zeros. Stage s is refilled with block c + S - 1 only after every thread passed block
// c - 1's wgmma wait (the barrier at the top of block c).
// PDL (pdl.cuh): the first S - 1 blocks' codes are in flight before cru_pdl_wait; x and
// the residual are read after it.
// EPI (the SwiGLU epilogue, linear_wgmma_swiglu_*): w is gate/up [2F, K] and y [M, F] =
// swiglu(gate, up), no residual. CTA x takes gate columns f0 = x BN / 2 .. and up columns
// F + f0 .. as its tile's two halves, so each thread holds a gate value and its up value
// in the same D slots of groups i and i + BN / 16 and writes their SwiGLU: a launch and the
// [M, 2F] intermediate fewer than the GEMM then swiglu_rows, with their bits.
#include "mma_common.cuh"
#include "pdl.cuh"
#include "rowops.cuh"
#include "wgmma_stage.cuh"

// The SwiGLU epilogue's store (EPI): the tile's groups i < BN / 16 hold gate columns
// f0 + 8 i + .., groups i + BN / 16 the up columns F + f0 + 8 i + .. in the same D slots
// (wp_issue_codes), so y[m, f] = swiglu(gate * scale[f], up * scale[F + f]) (rowops.cuh):
// the values the plain GEMM and then swiglu_rows give, and linear_mma_rows.cu's EPI. y is
// [M, F].
template <int BN>
__device__ __forceinline__ void wg_store_swiglu(const float (&total)[BN / 2], float* y,
                                                const float* scale, int r0, int f0, int t,
                                                int M, int F) {
#pragma unroll
    for (int i = 0; i < BN / 16; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = r0 + 8 * (e >> 1), f = f0 + 8 * i + 2 * t + (e & 1);
            if (row < M)
                y[(size_t)row * F + f] =
                    cru_swiglu(__fmul_rn(total[4 * i + e], scale[f]),
                               __fmul_rn(total[4 * (i + BN / 16) + e], scale[F + f]));
        }
}

template <int BN, int S, bool EPI = false>
__device__ __forceinline__ void linear_wgmma_body(const float* __restrict__ x,
                                                  const unsigned short* __restrict__ wp,
                                                  const float* __restrict__ scale,
                                                  const float* __restrict__ residual,
                                                  float* __restrict__ y, int M, int N, int K,
                                                  int mode) {
    CRU_DYNAMIC_SMEM(float4, wp_smem4);
    constexpr int XS = 64 * 64, CS = BN * 64;  // floats, bf16 a stage
    float* xs0 = reinterpret_cast<float*>(wp_smem4);
    unsigned short* cs0 = reinterpret_cast<unsigned short*>(xs0 + S * XS);
    constexpr int D = BN / 2;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    // EPI: the CTA's gate columns f0 = blockIdx.x BN / 2 .. and up columns F + f0 .. (N = 2F).
    const int F = N / 2, f0 = blockIdx.x * (BN / 2), up8 = (F + f0) / 8;
    const int n0 = EPI ? f0 : blockIdx.x * BN, m0 = blockIdx.y * 64, nblocks = K / 64;
    const int l0 = 16 * w + g;  // the thread's rows in the tile: l0 and l0 + 8
    const unsigned lbo = mode == 0 ? 128u : 256u, sbo = mode == 0 ? 256u : 128u;
    float part[3][D], total[D];
#pragma unroll
    for (int e = 0; e < D; ++e) total[e] = 0.0f;
#pragma unroll
    for (int s = 0; s < S - 1; ++s)  // weights: never written by a step
        if (s < nblocks) wp_issue_codes<BN, EPI>(cs0 + s * CS, wp, n0, K, s, threadIdx.x, up8);
    cru_pdl_wait();
    if (!EPI) cru_pdl_trigger();  // EPI: after the main loop, below
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {  // group s: block s's x (group 0 also the codes above)
        if (s < nblocks) wp_issue_x(xs0 + s * XS, x, m0, M, K, s, threadIdx.x);
        wp_commit();
    }
    for (int c = 0; c < nblocks; ++c) {
        wp_wait<S - 2>();  // block c's stage has landed (this thread's copies)
        wg_proxy_fence();
        __syncthreads();   // ... and every thread's; block c - 1's stage is free again
        const int next = c + S - 1, st = c % S;
        if (next < nblocks) {
            wp_issue_codes<BN, EPI>(cs0 + (next % S) * CS, wp, n0, K, next, threadIdx.x, up8);
            wp_issue_x(xs0 + (next % S) * XS, x, m0, M, K, next, threadIdx.x);
        }
        wp_commit();
        wg_block_value<BN>(xs0 + st * XS, cs0 + st * CS, l0, t, lbo, sbo, part);
#pragma unroll
        for (int e = 0; e < D; ++e)
            total[e] = __fadd_rn(total[e], wg_block_sum(part, e));
    }
    // EPI: the trigger waits for the epilogue. Given at the start, the down GEMM that
    // follows launched beside this kernel and the 256-row decode graph replayed 1.14x
    // slower on an H100 (bench/wgmma-swiglu-ab-h100.json); here 1.07x, elsewhere faster.
    if (EPI) cru_pdl_trigger();
    if (EPI)
        wg_store_swiglu<BN>(total, y, scale, m0 + l0, f0, t, M, F);
    else
        wg_store_tile<BN>(total, y, residual, scale, m0 + l0, n0, t, M, N);
}

#ifndef CRU_HOST_SHIM
// The forms kernels/linear_wgmma.py launches: linear_wgmma_<BN>_<S>, dynamic shared memory
// S * (16384 + 128 BN) bytes.
#define CRU_LINEAR_WGMMA(BN, S)                                                             \
    extern "C" __global__ void __launch_bounds__(128) linear_wgmma_##BN##_##S(              \
        const float* x, const unsigned short* wp, const float* scale, const float* residual, \
        float* y, int M, int N, int K, int mode) {                                          \
        linear_wgmma_body<BN, S>(x, wp, scale, residual, y, M, N, K, mode);                 \
    }
CRU_LINEAR_WGMMA(16, 4)
CRU_LINEAR_WGMMA(32, 3)
CRU_LINEAR_WGMMA(32, 4)
CRU_LINEAR_WGMMA(64, 3)
// The SwiGLU epilogue's forms: w is gate/up [2F, K], y [M, F], no residual; grid (2F / BN,
// ceil(M / 64)).
#define CRU_LINEAR_WGMMA_SWIGLU(BN, S)                                                      \
    extern "C" __global__ void __launch_bounds__(128) linear_wgmma_swiglu_##BN##_##S(       \
        const float* x, const unsigned short* wp, const float* scale, float* y, int M,      \
        int N, int K, int mode) {                                                           \
        linear_wgmma_body<BN, S, true>(x, wp, scale, nullptr, y, M, N, K, mode);            \
    }
CRU_LINEAR_WGMMA_SWIGLU(32, 3)
CRU_LINEAR_WGMMA_SWIGLU(64, 3)
#endif
