// linear_mma.cu: y[m, n] = scale[n] * sum_k x[m, k] * q[n, k] (plus residual[m, n] last) for
// int8 codes q, on the tensor cores, with every product exact and f32 accumulation.
//
// Why exact products: x (f32) is cut into three bf16 parts, x = hi + mid + lo exactly (hi:
// x with its low 16 bits cleared; mid: the same of x - hi; lo: the rest, at most 8
// significant bits), and an int8 code is a bf16 exactly. So each mma's products are the
// exact products of x's parts with the codes, summed by the tensor core into f32.
//
// Canonical order per output (m, n), fixed by this file and independent of M, of the row's
// place in the tile and of the launch shape: K is cut into 64-wide blocks; block c's value
// b_c = (lo + mid) + hi, three f32 accumulators from 0 that each take the block's four
// mma.m16n8k16 steps j ascending, part by part (thread slot s of step j, slots 2t, 2t+1,
// 2t+8, 2t+9 of lane group t = lane % 4, holds k = 64 c + 16 t + 4 j + s', s' = 0..3 in
// slot order: a lane's 16 bytes of q and four float4 of x cover its slots of all four
// steps); total = 0 + b_0 + b_1 + ... ascending; times scale[n]; residual + that, last.
// Blocks are independent, so a kernel may compute them in any place and add them in
// order (linear_mma_rows.cu splits K over warps).
// An mma's output rows are independent dot products, so rows never change each other.
//
// Layout: x f32 [M, K] row-major; w int8 [N, K] row-major (DeviceWeight.w: the mma's
// column-major B); scale f32 [N]; y, residual f32 [M, N]. K % 64 == 0, N % 8 == 0, 16-byte
// aligned rows (the host checks).
// Thread mapping: CTA of WM x WN warps; warp (wm, wn) owns rows m0 + 16 (MT wm + i), i < MT,
// and columns n0 + 8 (NT wn + c), c < NT, of the CTA's (16 MT WM) x (8 NT WN) tile; lane =
// 4 g + t: rows g and g + 8 of each 16-row tile (A and C), column g of each 8-column tile
// (B), C columns 2t, 2t + 1. Grid (N / (8 NT WN), ceil(M / (16 MT WM))). No shared memory:
// x and q come through L1 (a CTA's warps share rows and columns). ONE_ACC (a negative
// control for the checks, never routed): one accumulator for all three parts, other bits.
// PDL (pdl.cuh): the first K block's codes load before cru_pdl_wait; x and the residual
// after it. PF (the host's choice for small grids, kernels/linear_mma.py PF_MAX_CTAS): loads
// run a block ahead, block c + 1's codes (and with MT = 1 its x) in flight while block c's
// mmas run. In a grid of about a CTA a SM nothing else hides a block's load latency (down's
// K = 1536 is 24 blocks in a row); in larger grids the registers it takes (up to twice)
// cost more occupancy than it saves. Which registers hold a value never changes its
// arithmetic, so both give the same bits. BW (bf16 weights): w points at the codes as bf16
// (DeviceWeight.wb, [N, K] uint16, each code's exact bf16), so a block's B registers are
// loaded, not converted: the same registers, the same bits, fewer instructions a block
// (Nsight Compute at 256 rows: the int8 conversion's PRMT and FADD are a quarter of a
// block's instructions). No standard headers (NVRTC).
#include "mma_common.cuh"
#include "pdl.cuh"

// A lane's codes of one column for a block (k = kb + 16 t ..): 16 int8 bytes, or with BW
// (CB = 2) the same 16 codes as bf16 (kernels/linear_mma.py: DeviceWeight.wb), 32 bytes.
template <int CB>
__device__ __forceinline__ void cru_codes_ld(int4 (&q)[CB], const signed char* p) {
#pragma unroll
    for (int h = 0; h < CB; ++h) q[h] = __ldg(reinterpret_cast<const int4*>(p) + h);
}

// B registers of step j from a lane's block codes: int8 codes converted (cru_codes_b), or
// with BW the bf16 pairs as they lie (the same values: an int8 code is a bf16 exactly).
template <bool BW>
__device__ __forceinline__ void cru_step_b(const int4 (&q)[BW ? 2 : 1], int j, unsigned (&b)[2]) {
    if constexpr (BW) {
        const int4 h = q[j >> 1];
        b[0] = (unsigned)((j & 1) ? h.z : h.x);
        b[1] = (unsigned)((j & 1) ? h.w : h.y);
    } else {
        cru_codes_b(cru_word(q[0], j), b);
    }
}

template <int MT, int NT, int WM, int WN, bool ONE_ACC, bool PF = false, bool BW = false>
__global__ void __launch_bounds__(32 * WM * WN)
linear_mma(const float* __restrict__ x, const signed char* __restrict__ w,
           const float* __restrict__ scale, const float* __restrict__ residual,
           float* __restrict__ y, int M, int N, int K) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp / WN, wn = warp % WN;
    constexpr int CB = BW ? 2 : 1;  // bytes a code takes in w (BW: bf16 codes)
    const int m0 = blockIdx.y * (16 * MT * WM) + 16 * MT * wm;
    const int n0 = blockIdx.x * (8 * NT * WN) + 8 * NT * wn;
    float part[MT][NT][3][4], total[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int c = 0; c < NT; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                total[i][c][e] = part[i][c][0][e] = part[i][c][1][e] = part[i][c][2][e] = 0.0f;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // Codes of column g of each tile at k = kb + 16 t (a lane's 16 bytes of block kb / 64).
    const signed char* wq[NT];
#pragma unroll
    for (int c = 0; c < NT; ++c) wq[c] = w + ((size_t)(n0 + 8 * c + g) * K + 16 * t) * CB;
    // Rows g and g + 8 of the warp's 16-row tiles, from k = 16 t (MT = 1's x prefetch).
    const int r0 = m0 + g, r1 = r0 + 8;
    const float* x0 = x + (size_t)r0 * K + 16 * t;
    const float* x1 = x + (size_t)r1 * K + 16 * t;
    int4 q[NT][CB], qn[NT][CB];
#pragma unroll
    for (int c = 0; c < NT; ++c)  // block 0's codes: weights, never written by a step
        cru_codes_ld<CB>(q[c], wq[c]);
    cru_pdl_wait();
    cru_pdl_trigger();
    constexpr bool XPF = PF && MT == 1;  // x a block ahead too
    float4 xa[4][2], xb[4][2];  // XPF: this block's x, the next block's
    if (XPF) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            xa[j][0] = r0 < M ? __ldg(reinterpret_cast<const float4*>(x0 + 4 * j)) : zero4;
            xa[j][1] = r1 < M ? __ldg(reinterpret_cast<const float4*>(x1 + 4 * j)) : zero4;
        }
    }
    for (int kb = 0; kb < K; kb += 64) {
        const int kt = kb + 16 * t;
        const bool more = PF && kb + 64 < K;
        if (!PF && kb > 0) {  // this block's codes, now
#pragma unroll
            for (int c = 0; c < NT; ++c) cru_codes_ld<CB>(q[c], wq[c] + kb * CB);
        }
        if (more) {  // the next block's loads, in flight through this block's mmas
#pragma unroll
            for (int c = 0; c < NT; ++c)
                cru_codes_ld<CB>(qn[c], wq[c] + (kb + 64) * CB);
            if (XPF) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    xb[j][0] = r0 < M ? __ldg(reinterpret_cast<const float4*>(
                                            x0 + kb + 64 + 4 * j)) : zero4;
                    xb[j][1] = r1 < M ? __ldg(reinterpret_cast<const float4*>(
                                            x1 + kb + 64 + 4 * j)) : zero4;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            unsigned b[NT][2];
#pragma unroll
            for (int c = 0; c < NT; ++c) cru_step_b<BW>(q[c], j, b[c]);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int s0 = m0 + 16 * i + g, s1 = s0 + 8;
                float4 v0, v1;
                if (XPF) {
                    v0 = xa[j][0];
                    v1 = xa[j][1];
                } else {
                    v0 = s0 < M ? __ldg(reinterpret_cast<const float4*>(
                                      x + (size_t)s0 * K + kt + 4 * j)) : zero4;
                    v1 = s1 < M ? __ldg(reinterpret_cast<const float4*>(
                                      x + (size_t)s1 * K + kt + 4 * j)) : zero4;
                }
                unsigned a[3][4];
                cru_split_a(v0, v1, a);
#pragma unroll
                for (int c = 0; c < NT; ++c) cru_mma3<ONE_ACC>(part[i][c], a, b[c]);
            }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int c = 0; c < NT; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    total[i][c][e] = cru_block_add<ONE_ACC>(total[i][c][e], part[i][c], e);
        if (more) {
#pragma unroll
            for (int c = 0; c < NT; ++c)
#pragma unroll
                for (int h = 0; h < CB; ++h) q[c][h] = qn[c][h];
            if (XPF) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    xa[j][0] = xb[j][0];
                    xa[j][1] = xb[j][1];
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int c = 0; c < NT; ++c) {
            const int col = n0 + 8 * c + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m0 + 16 * i + g + 8 * h;
                if (row < M)
                    cru_mma_store(y, residual, scale, row, col, N, total[i][c][2 * h],
                                  total[i][c][2 * h + 1]);
            }
        }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the forms linear_mma.py compiles (FORMS, CONTROL), so
// `-Xptxas -v` reports their registers and spills (tests/test_attention_nvcc.py).
#define CRU_MMA_TILE(MT, NT, WM, WN, ONE, PF)                                               \
    template __global__ void linear_mma<MT, NT, WM, WN, ONE, PF>(                           \
        const float*, const signed char*, const float*, const float*, float*, int, int, int);
#define CRU_MMA_TILE2(MT, NT, WM, WN) \
    CRU_MMA_TILE(MT, NT, WM, WN, false, false) CRU_MMA_TILE(MT, NT, WM, WN, false, true)
CRU_MMA_TILE2(1, 2, 2, 2)
CRU_MMA_TILE2(1, 2, 1, 4)
CRU_MMA_TILE2(1, 4, 2, 2)
CRU_MMA_TILE2(2, 2, 2, 2)
CRU_MMA_TILE2(2, 4, 2, 2)
CRU_MMA_TILE2(1, 1, 4, 2)
CRU_MMA_TILE2(4, 2, 1, 4)
CRU_MMA_TILE2(2, 4, 4, 1)
CRU_MMA_TILE(1, 2, 2, 2, true, false)
#define CRU_MMA_TILE_BW(MT, NT, WM, WN, PF)                                                 \
    template __global__ void linear_mma<MT, NT, WM, WN, false, PF, true>(                   \
        const float*, const signed char*, const float*, const float*, float*, int, int, int);
CRU_MMA_TILE_BW(1, 4, 2, 2, false)
CRU_MMA_TILE_BW(1, 4, 2, 2, true)
CRU_MMA_TILE_BW(2, 4, 4, 1, false)
CRU_MMA_TILE_BW(2, 4, 2, 2, false)
#endif
