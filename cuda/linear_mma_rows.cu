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
// Layout: as linear_mma.cu (x f32 [M, K], w int8 [N, K], scale f32 [N], y, residual f32
// [M, N]; K % 64 == 0, N % (8 NT) == 0, 16-byte aligned rows).
// Thread mapping: CTA (n tile, 16-row tile) = (blockIdx.x, blockIdx.y), columns n0 = 8 NT
// blockIdx.x .., rows m0 = 16 blockIdx.y ..; warp w computes blocks c = w, w + warps, ...
// of all NT 8-column tiles (lane 4 g + t: A rows g, g + 8; B column g; C columns 2t, 2t+1)
// and writes each block value to shared memory; then thread i adds, for outputs i, i +
// threads, ... of the 16 x 8 NT tile, the values of blocks 0, 1, ... in order.
// Shared memory (dynamic): float blk[K / 64][16][8 NT]. PDL (pdl.cuh): each warp's first
// block's codes load before cru_pdl_wait (at decode sizes that is most of a warp's codes);
// x and the residual after it. No standard headers (NVRTC).
#include "mma_common.cuh"
#include "pdl.cuh"

#ifndef CRU_DYNAMIC_SMEM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

template <int NT, bool ONE_ACC>
__global__ void __launch_bounds__(512)
linear_mma_rows(const float* __restrict__ x, const signed char* __restrict__ w,
                const float* __restrict__ scale, const float* __restrict__ residual,
                float* __restrict__ y, int M, int N, int K) {
    CRU_DYNAMIC_SMEM(float, blk);
    constexpr int TW = 8 * NT;  // the tile's columns
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * TW, m0 = blockIdx.y * 16, nb = K >> 6;
    const int r0 = m0 + g, r1 = r0 + 8;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int4 q[NT];
    const int first = warp < nb ? warp : 0;  // a warp with no block loads block 0, unused
#pragma unroll
    for (int n = 0; n < NT; ++n)  // weights, never written by a step (pdl.cuh)
        q[n] = __ldg(reinterpret_cast<const int4*>(w + (size_t)(n0 + 8 * n + g) * K +
                                                   64 * first + 16 * t));
    cru_pdl_wait();
    cru_pdl_trigger();
    for (int c = warp; c < nb; c += warps) {
        const int kt = 64 * c + 16 * t;
        if (c != warp) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
                q[n] = __ldg(reinterpret_cast<const int4*>(w + (size_t)(n0 + 8 * n + g) * K + kt));
        }
        float4 v0[4], v1[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v0[j] = r0 < M ? __ldg(reinterpret_cast<const float4*>(x + (size_t)r0 * K + kt + 4 * j))
                           : zero4;
            v1[j] = r1 < M ? __ldg(reinterpret_cast<const float4*>(x + (size_t)r1 * K + kt + 4 * j))
                           : zero4;
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
    for (int i = threadIdx.x; i < 16 * TW; i += blockDim.x) {
        const int row = m0 + i / TW, col = n0 + i % TW;
        if (row >= M) continue;
        float total = 0.0f;
        for (int c = 0; c < nb; ++c) total = __fadd_rn(total, blk[(size_t)c * 16 * TW + i]);
        float v = __fmul_rn(total, scale[col]);
        if (residual) v = __fadd_rn(residual[(size_t)row * N + col], v);
        y[(size_t)row * N + col] = v;
    }
}
