// linear_mma_smem.cu: linear_mma.cu's GEMM in linear_mma.cu's order, for many rows, with x
// split into its three bf16 parts once per CTA instead of once per warp.
//
// Why: linear_mma.cu's warps load their rows of x through L1 and cut every value into its
// three parts themselves, again for every column tile; at 256-1,024 rows a block's ~630
// instructions a warp are mostly that split and the code conversion, against 48 mmas
// (docs/throughput.md). Here a CTA stages each 64-wide K block of its rows, split once, in
// shared memory beside the block's codes as bf16 (DeviceWeight.wb), and its warps only load
// fragments and run mmas.
//
// Order, per output (m, n), exactly linear_mma.cu's: block c's value is (lo + mid) + hi of
// three accumulators from 0, each over the block's four mma.m16n8k16 steps j ascending with
// the same fragment slots (lane t's slots 2t, 2t+1 and 2t+8, 2t+9 of step j hold k = 64 c +
// 16 t + 4 j + 0, 1 and + 2, 3); total = 0 + b_0 + b_1 + ...; times scale[n]; residual last.
// The parts run one after another (lo, mid, hi) instead of interleaved: each accumulator
// still takes its own four steps in order, so the bits are the same, and only two are live.
//
// Layout: x f32 [M, K]; wb the codes as bf16 [N, K]; scale f32 [N]; y, residual f32 [M, N];
// K % 64 == 0, N % BN == 0 (the host checks). Shared memory (dynamic): the parts
// [DB ? 2 : 1][3][BM][68] bf16 and the codes [2 stages][BN][68] bf16. A row is 136 bytes, so
// the 8-byte fragment loads of a half warp (rows g, lane groups t: bank 2 g + 8 t + 2 j)
// fall on distinct banks.
// Thread mapping: CTA of WM x WN warps, a BM = 32 WM row x BN = 32 WN column tile; warp
// (wm, wn) owns rows 32 wm + 16 i + (g, g + 8), i < 2, and columns 32 wn + 8 c + g, c < 4
// (linear_mma.cu's MT = 2, NT = 4 warp tile); lane = 4 g + t; a block's B fragments stay in
// registers through its three parts. The split: thread tid cuts k = 4 (tid % 16) .. + 3 of
// rows tid / 16 + q NTH / 16 of each block, from registers loaded a block ahead (a warp's
// loads are two rows' 512 contiguous bytes; a half warp stores one row's 128 contiguous
// bytes a part: no bank conflicts). The codes: 8-byte cp.async pieces, 16 consecutive
// threads a column, double-buffered.
// Per block c, DB = false: barrier (every warp is done with block c - 1); split block c
// into the parts; start block c + 1's codes and x loads; wait for block c's codes; barrier;
// the mmas. DB = true (two parts buffers): start block c + 1's codes, split block c + 1 and
// load block c + 2's x, block c's mmas, wait for the codes; one barrier a block.
// PDL (pdl.cuh): block 0's codes are copied before cru_pdl_wait; x and the residual after.
// No standard headers (NVRTC).
#include "mma_common.cuh"
#include "pdl.cuh"

#ifndef CRU_DYNAMIC_SMEM  // the host shim maps it to its own buffer (tests/cuda_host/prelude.h)
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

#define CRU_SM_ROW 68  // bf16 a staged row: 64 values and 4 of padding (136 bytes)

#ifndef CRU_HOST_SHIM
__device__ __forceinline__ void cru_cp8(void* dst, const void* src) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(at), "l"(src) : "memory");
}
__device__ __forceinline__ void cru_cp_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cru_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void cru_cp8(void* dst, const void* src) { __builtin_memcpy(dst, src, 8); }
__device__ __forceinline__ void cru_cp_commit() {}
template <int N>
__device__ __forceinline__ void cru_cp_wait() {}
#endif

// Block kb's codes of the CTA's BN columns into one stage: piece p (8 bytes, 4 codes) of
// column n at [n][4 p].
template <int BN, int NTH>
__device__ __forceinline__ void cru_stage_codes(unsigned short* dst, const unsigned short* wb,
                                                int n0, int K, int kb, int tid) {
#pragma unroll
    for (int i = 0; i < BN * 16 / NTH; ++i) {
        const int p = tid + i * NTH, n = p >> 4, piece = p & 15;
        cru_cp8(dst + n * CRU_SM_ROW + 4 * piece, wb + (size_t)(n0 + n) * K + kb + 4 * piece);
    }
}

// Two bf16 parts of x (the f32 top halves) -> one word, the first in the low half.
__device__ __forceinline__ unsigned cru_pair(float first, float second) {
    return cru_bf16x2(first, second);
}

// The B fragments of one step for the warp's four 8-column tiles: column n + 8 c, k .. k + 3.
__device__ __forceinline__ void cru_load_b(unsigned (&b)[4][2], const unsigned short* cs, int n,
                                           int k) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const uint2 v = *reinterpret_cast<const uint2*>(cs + (n + 8 * c) * CRU_SM_ROW + k);
        b[c][0] = v.x;
        b[c][1] = v.y;
    }
}

// A thread's share of one block of x: four values of rows row0 + q step (q < NQ), k .. k + 3
// of the block at kb (rows past M: zeros).
template <int NQ>
__device__ __forceinline__ void cru_load_x(float4 (&xr)[NQ], const float* x, int row0, int step,
                                           int M, int K, int kb, int k) {
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const int row = row0 + q * step;
        xr[q] = row < M ? __ldg(reinterpret_cast<const float4*>(x + (size_t)row * K + kb + k))
                        : zero4;
    }
}

// The same share cut into its three parts, stored at [part][row][k] of the parts planes
// (BM rows each).
template <int NQ, int BM>
__device__ __forceinline__ void cru_split_store(const float4 (&xr)[NQ], unsigned short* parts,
                                                int row0, int step, int k) {
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const float v[4] = {xr[q].x, xr[q].y, xr[q].z, xr[q].w};
        float p[3][4];
#pragma unroll
        for (int e = 0; e < 4; ++e) cru_split3(v[e], p[0][e], p[1][e], p[2][e]);
        unsigned short* dst = parts + (row0 + q * step) * CRU_SM_ROW + k;
#pragma unroll
        for (int s = 0; s < 3; ++s)
            *reinterpret_cast<uint2*>(dst + s * BM * CRU_SM_ROW) =
                make_uint2(cru_pair(p[s][0], p[s][1]), cru_pair(p[s][2], p[s][3]));
    }
}

// One block's mmas for the warp's 32 x 32 tile (rows r0 + 16 i, columns n0 + 8 c of the
// staged planes and codes): the parts lo, mid, hi one after another, each accumulator from 0
// over the four steps j; total += (lo + mid) + hi.
template <int BM>
__device__ __forceinline__ void cru_block_mmas(float (&total)[2][4][4], const unsigned short* parts,
                                               const unsigned short* cs, int r0, int n0, int g,
                                               int t) {
    unsigned b[4][4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) cru_load_b(b[j], cs, n0 + g, 16 * t + 4 * j);
    float sum[2][4][4], acc[2][4][4];  // lo accumulates in sum itself
#pragma unroll
    for (int step = 0; step < 3; ++step) {
        const unsigned short* ps = parts + (2 - step) * BM * CRU_SM_ROW;
        float (&d)[2][4][4] = step == 0 ? sum : acc;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = r0 + 16 * i + g;
                const uint2 lo = *reinterpret_cast<const uint2*>(ps + r * CRU_SM_ROW + 16 * t + 4 * j);
                const uint2 hi =
                    *reinterpret_cast<const uint2*>(ps + (r + 8) * CRU_SM_ROW + 16 * t + 4 * j);
                const unsigned a[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    if (j == 0) {
                        cru_mma0(d[i][c], a, b[j][c]);  // each accumulator from 0
                    } else {
                        cru_mma(d[i][c], a, b[j][c]);
                    }
                }
            }
        if (step == 0) continue;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (step == 1) {
                        sum[i][c][e] = __fadd_rn(sum[i][c][e], acc[i][c][e]);  // lo + mid
                    } else {  // total + ((lo + mid) + hi)
                        total[i][c][e] = __fadd_rn(total[i][c][e],
                                                   __fadd_rn(sum[i][c][e], acc[i][c][e]));
                    }
                }
    }
}

template <int WM, int WN, bool DB>
__global__ void __launch_bounds__(32 * WM * WN)
linear_mma_smem(const float* __restrict__ x, const unsigned short* __restrict__ wb,
                const float* __restrict__ scale, const float* __restrict__ residual,
                float* __restrict__ y, int M, int N, int K) {
    constexpr int BM = 32 * WM, BN = 32 * WN, NTH = 32 * WM * WN, NQ = 16 / WN, RSTEP = NTH / 16;
    static_assert(BN * 16 % NTH == 0 && NQ >= 1, "linear_mma_smem: unsupported form");
    constexpr int PLANES = 3 * BM * CRU_SM_ROW, STAGE = BN * CRU_SM_ROW;
    CRU_DYNAMIC_SMEM(unsigned short, smem);
    unsigned short* parts = smem;                           // [DB ? 2 : 1][3][BM][CRU_SM_ROW]
    unsigned short* codes = smem + (DB ? 2 : 1) * PLANES;  // [2][BN][CRU_SM_ROW]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wm = warp / WN, wn = warp % WN;
    const int m_cta = blockIdx.y * BM, n_cta = blockIdx.x * BN, nb = K / 64;
    const int s_row = tid >> 4, s_k = 4 * (tid & 15);  // the split's rows and k

    cru_stage_codes<BN, NTH>(codes, wb, n_cta, K, 0, tid);  // weights: before the PDL wait
    cru_cp_commit();
    cru_pdl_wait();
    cru_pdl_trigger();
    float4 xr[NQ];
    cru_load_x<NQ>(xr, x, m_cta + s_row, RSTEP, M, K, 0, s_k);
    float total[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) total[i][c][e] = 0.0f;

    if constexpr (DB) {
        // Parts in two buffers: block cb + 1 is split (and cb + 2 loaded) while block cb's
        // mmas run, one barrier a block.
        cru_split_store<NQ, BM>(xr, parts, s_row, RSTEP, s_k);
        if (nb > 1) cru_load_x<NQ>(xr, x, m_cta + s_row, RSTEP, M, K, 64, s_k);
        cru_cp_wait<0>();
        __syncthreads();
        for (int cb = 0; cb < nb; ++cb) {
            if (cb + 1 < nb) {  // free: block cb - 1's mmas are behind the last barrier
                cru_stage_codes<BN, NTH>(codes + ((cb + 1) & 1) * STAGE, wb, n_cta, K,
                                         64 * (cb + 1), tid);
                cru_cp_commit();
                cru_split_store<NQ, BM>(xr, parts + ((cb + 1) & 1) * PLANES, s_row, RSTEP, s_k);
                if (cb + 2 < nb) cru_load_x<NQ>(xr, x, m_cta + s_row, RSTEP, M, K, 64 * (cb + 2), s_k);
            }
            cru_block_mmas<BM>(total, parts + (cb & 1) * PLANES, codes + (cb & 1) * STAGE,
                               32 * wm, 32 * wn, g, t);
            cru_cp_wait<0>();
            __syncthreads();
        }
    } else {
        for (int cb = 0; cb < nb; ++cb) {
            __syncthreads();  // every warp is done with block cb - 1's parts and codes
            cru_split_store<NQ, BM>(xr, parts, s_row, RSTEP, s_k);
            if (cb + 1 < nb) {  // block cb + 1: its codes into the other stage, its x into xr
                cru_stage_codes<BN, NTH>(codes + ((cb + 1) & 1) * STAGE, wb, n_cta, K,
                                         64 * (cb + 1), tid);
                cru_cp_commit();
                cru_load_x<NQ>(xr, x, m_cta + s_row, RSTEP, M, K, 64 * (cb + 1), s_k);
                cru_cp_wait<1>();  // block cb's codes have landed (cb + 1's may be in flight)
            } else {
                cru_cp_wait<0>();
            }
            __syncthreads();  // the parts and block cb's codes, visible to every warp
            cru_block_mmas<BM>(total, parts, codes + (cb & 1) * STAGE, 32 * wm, 32 * wn, g, t);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int col = n_cta + 32 * wn + 8 * c + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m_cta + 32 * wm + 16 * i + g + 8 * h;
                if (row < M)
                    cru_mma_store(y, residual, scale, row, col, N, total[i][c][2 * h],
                                  total[i][c][2 * h + 1]);
            }
        }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the forms linear_mma.py compiles (SMEM_FORMS), so
// `-Xptxas -v` reports their registers and spills (tests/test_attention_nvcc.py).
#define CRU_MMA_SMEM(WM, WN, DB)                                                          \
    template __global__ void linear_mma_smem<WM, WN, DB>(const float*, const unsigned short*, \
                                                         const float*, const float*, float*, \
                                                         int, int, int);
#define CRU_MMA_SMEM2(WM, WN) CRU_MMA_SMEM(WM, WN, true) CRU_MMA_SMEM(WM, WN, false)
CRU_MMA_SMEM2(2, 2)
CRU_MMA_SMEM2(4, 2)
CRU_MMA_SMEM2(2, 4)
CRU_MMA_SMEM2(1, 4)
#endif
