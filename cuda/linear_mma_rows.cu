// linear_mma_rows.cu: the tensor-core int8 GEMM of linear_mma.cu for few rows (decode
// sizes), its K blocks spread over a CTA's warps, same bits: linear_mma.cu states the order
// (block values b_c from three part accumulators, total = 0 + b_0 + b_1 + ... ascending,
// times scale, residual last), and blocks are independent, so a warp may compute any block
// as long as the totals add them in ascending c.
//
// Why: at M = 1..64 a CTA per output tile with a K loop leaves most SMs idle and every
// warp waiting on one block's loads after another; here each 64-wide K block of a column
// tile is its own warp's work, and all the loads of a CTA are in flight at once.
//
// NORM (the RMSNorm prologue): x's rows are normalised on the way in, x * inv * norm_w
// with inv from rowops.cuh's canonical tree (the CTA's 16 rows at once), the values
// rmsnorm_rows would write, so fused == rmsnorm_rows then this kernel, bit for bit. The
// CTA's rows are first copied to shared memory in one pass, every load in flight at once:
// summing squares straight from global memory made each of the tree's ~11 passes over 16
// rows wait on its own loads (2-3x slower than the separate kernels from 16 rows on).
// EPI (the SwiGLU epilogue, NT even; with or without NORM): w is gate/up [2F, K]; tiles
// 0 .. NT/2 - 1 take gate rows f0 + ..., the rest the up rows F + f0 + ...; y[m, f] =
// swiglu(g * scale[f], u * scale[F + f]) (rowops.cuh), the values gemm then swiglu_rows give.
//
// Layout: as linear_mma.cu (x f32 [M, K], w int8 [N, K], scale f32 [N], y, residual f32
// [M, N]; K % 64 == 0, N % (8 NT) == 0, 16-byte aligned rows); norm_w f32 [K]; with EPI y
// is [M, N / 2] and there is no residual.
// Thread mapping: CTA (n tile, 16-row tile) = (blockIdx.x, blockIdx.y), columns n0 = 8 NT
// blockIdx.x .. (EPI: gate f0 = 4 NT blockIdx.x .. and up F + f0 ..), rows m0 = 16
// blockIdx.y ..; warp w computes blocks c = w, w + warps, ... of all NT 8-column tiles
// (lane 4 g + t: A rows g, g + 8; B column g; C columns 2t, 2t+1) and writes each block
// value to shared memory; then thread i adds, for outputs i, i + threads, ... of the tile,
// the values of blocks 0, 1, ... in order.
// Shared memory (dynamic): float blk[K / 64][16][8 NT], then under NORM float xs[R][K] with
// R = min(16, M) (the CTA's rows; a last tile holds fewer); static: the norm's 16 x 8 warp
// partials and 16 inverses. PDL (pdl.cuh): each warp's first block's codes load before
// cru_pdl_wait (at decode sizes that is most of a warp's codes); x and the residual after
// it. No standard headers (NVRTC).
#include "mma_common.cuh"
#include "pdl.cuh"
#include "rowops.cuh"

#ifndef CRU_DYNAMIC_SMEM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

// Normalise one float4 of row r's x at k (NORM): rmsnorm_rows' cru_norm_apply, per element.
__device__ __forceinline__ float4 cru_norm4(float4 v, float inv, const float* nw, int k) {
    const float4 w = __ldg(reinterpret_cast<const float4*>(nw + k));
    return make_float4(cru_norm_apply(v.x, inv, w.x), cru_norm_apply(v.y, inv, w.y),
                       cru_norm_apply(v.z, inv, w.z), cru_norm_apply(v.w, inv, w.w));
}

// Four of x's values: from shared memory (STAGED) or through the read-only path.
template <bool STAGED>
__device__ __forceinline__ float4 cru_x4(const float* p) {
    return STAGED ? *reinterpret_cast<const float4*>(p) : __ldg(reinterpret_cast<const float4*>(p));
}

template <int NT, bool ONE_ACC, bool NORM, bool EPI>
__global__ void __launch_bounds__(512)
linear_mma_rows(const float* __restrict__ x, const signed char* __restrict__ w,
                const float* __restrict__ scale, const float* __restrict__ residual,
                float* __restrict__ y, int M, int N, int K, const float* __restrict__ norm_w,
                float eps) {
    static_assert(!EPI || NT % 2 == 0, "the SwiGLU epilogue pairs gate and up tiles");
    CRU_DYNAMIC_SMEM(float, blk);
    __shared__ float red[NORM ? 16 * 8 : 1], inv[NORM ? 16 : 1];
    constexpr int TW = 8 * NT;  // the tile's columns
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * TW, m0 = blockIdx.y * 16, nb = K >> 6;
    const int F = N / 2, f0 = blockIdx.x * (TW / 2);
    const int r0 = m0 + g, r1 = r0 + 8;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const signed char* wr[NT];  // the weight row of each tile's column g
#pragma unroll
    for (int n = 0; n < NT; ++n)
        wr[n] = w + (size_t)(EPI ? (n < NT / 2 ? f0 + 8 * n : F + f0 + 8 * (n - NT / 2))
                                 : n0 + 8 * n) * K + (size_t)g * K;
    int4 q[NT];
    const int first = warp < nb ? warp : 0;  // a warp with no block loads block 0, unused
#pragma unroll
    for (int n = 0; n < NT; ++n)  // weights, never written by a step (pdl.cuh)
        q[n] = __ldg(reinterpret_cast<const int4*>(wr[n] + 64 * first + 16 * t));
    // The thread's first output of the finisher (i = threadIdx.x below): its scales before
    // the PDL wait (weights) and its residual right after it, so neither load waits at the
    // end of the kernel's critical path; the same values the finisher would load there.
    constexpr int OW = EPI ? TW / 2 : TW;  // the tile's outputs a row
    const int o_r = threadIdx.x / OW, o_j = threadIdx.x % OW;
    const bool own = (int)threadIdx.x < 16 * OW && m0 + o_r < M;
    float sc_a = 0.0f, sc_b = 0.0f, res_0 = 0.0f;
    if (own) {
        sc_a = __ldg(scale + (EPI ? f0 : n0) + o_j);
        if (EPI) sc_b = __ldg(scale + F + f0 + o_j);
    }
    cru_pdl_wait();
    cru_pdl_trigger();
    if (!EPI && own && residual) res_0 = residual[(size_t)(m0 + o_r) * N + n0 + o_j];
    float* xs = blk + (size_t)nb * 16 * TW;  // NORM: the CTA's rows, staged
    if (NORM) {  // the CTA's rows' inverses, in rmsnorm_rows' order (rowops.cuh)
        const int live = min(16, M - m0);
        const float4* src = reinterpret_cast<const float4*>(x + (size_t)m0 * K);
        float4* dst = reinterpret_cast<float4*>(xs);
        for (int i = threadIdx.x; i < live * (K >> 2); i += blockDim.x) dst[i] = src[i];
        __syncthreads();
        cru_rows_sumsq(xs, live, K, red);
        if ((int)threadIdx.x < live) inv[threadIdx.x] = cru_inv_rms(cru_rows_total(red, threadIdx.x), K, eps);
        __syncthreads();
    }
    // Row r of the CTA's x: staged under NORM, else straight from global memory.
    const float* x0 = NORM ? xs + (size_t)g * K : x + (size_t)r0 * K;
    const float* x1 = NORM ? xs + (size_t)(g + 8) * K : x + (size_t)r1 * K;
    for (int c = warp; c < nb; c += warps) {
        const int kt = 64 * c + 16 * t;
        if (c != warp) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
                q[n] = __ldg(reinterpret_cast<const int4*>(wr[n] + kt));
        }
        float4 v0[4], v1[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v0[j] = r0 < M ? cru_x4<NORM>(x0 + kt + 4 * j) : zero4;
            v1[j] = r1 < M ? cru_x4<NORM>(x1 + kt + 4 * j) : zero4;
            if (NORM) {
                if (r0 < M) v0[j] = cru_norm4(v0[j], inv[g], norm_w, kt + 4 * j);
                if (r1 < M) v1[j] = cru_norm4(v1[j], inv[g + 8], norm_w, kt + 4 * j);
            }
        }
        float part[NT][3][4];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[n][0][e] = part[n][1][e] = part[n][2][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            unsigned a[3][4];
            cru_split_a(v0[j], v1[j], a);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                unsigned b[2];
                cru_codes_b(cru_word(q[n], j), b);
                cru_mma3<ONE_ACC>(part[n], a, b);
            }
        }
        float* out = blk + (size_t)c * 16 * TW;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)  // cru_block_add from 0: the block's value itself
                out[(g + 8 * (e >> 1)) * TW + 8 * n + 2 * t + (e & 1)] =
                    cru_block_add<ONE_ACC>(0.0f, part[n], e) ;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * OW; i += blockDim.x) {
        const int r = i / OW, j = i % OW, row = m0 + r;
        if (row >= M) continue;
        float total = 0.0f, up = 0.0f;
        for (int c = 0; c < nb; ++c) {
            const float* b = blk + (size_t)c * 16 * TW + r * TW;
            total = __fadd_rn(total, b[j]);
            if (EPI) up = __fadd_rn(up, b[OW + j]);
        }
        const bool pre = i == (int)threadIdx.x;  // the output loaded for ahead
        if (EPI) {
            const float sg = pre ? sc_a : scale[f0 + j], su = pre ? sc_b : scale[F + f0 + j];
            y[(size_t)row * F + f0 + j] = cru_swiglu(__fmul_rn(total, sg), __fmul_rn(up, su));
            continue;
        }
        float v = __fmul_rn(total, pre ? sc_a : scale[n0 + j]);
        if (residual) v = __fadd_rn(pre ? res_0 : residual[(size_t)row * N + n0 + j], v);
        y[(size_t)row * N + n0 + j] = v;
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the forms linear_mma.py compiles, so `-Xptxas -v`
// reports their registers and spills (tests/test_attention_nvcc.py).
#define CRU_MMA_ROWS(NT, ONE, NORM, EPI)                                                      \
    template __global__ void linear_mma_rows<NT, ONE, NORM, EPI>(                             \
        const float*, const signed char*, const float*, const float*, float*, int, int, int, \
        const float*, float);
CRU_MMA_ROWS(1, false, false, false)
CRU_MMA_ROWS(2, false, false, false)
CRU_MMA_ROWS(4, false, false, false)
CRU_MMA_ROWS(2, true, false, false)
CRU_MMA_ROWS(1, false, true, false)
CRU_MMA_ROWS(2, false, true, false)
CRU_MMA_ROWS(4, false, true, false)
CRU_MMA_ROWS(2, false, true, true)
CRU_MMA_ROWS(4, false, true, true)
CRU_MMA_ROWS(2, false, false, true)
CRU_MMA_ROWS(4, false, false, true)
#endif
