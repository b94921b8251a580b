// linear_mma_pipe.cu: linear_mma.cu's tile GEMM (same forms, same bits) with x and the
// codes staged through shared memory by a cp.async pipeline, and optionally K groups.
//
// Why: at mid M (the 256-row decode steps of a busy server) linear_mma.cu's grid is a
// wave or less, one warp a scheduler, and that warp waits on its own global loads block
// after block (Nsight Compute, qkv at 256 rows: 39% of stalls on the x loads; its
// block-ahead prefetch holds the next block in 100 registers, so no second warp fits).
// Here S - 1 blocks are in flight in shared memory without registers, and KG copies of
// the CTA's warps (K groups) split the K blocks so each warp walks a fraction of them.
//
// Order: linear_mma.cu's, unchanged. A warp builds exactly the A and B registers
// linear_mma builds for a block (x's three-part split of the same four k per lane and
// step, the same codes), issues the same mmas in the same order into three part
// accumulators from 0, and takes the block value (lo + mid) + hi; total = 0 + b_0 + b_1
// + ... ascending. With KG > 1, copy gk computes blocks gk, gk + KG, ...: a round r covers
// blocks r KG .. r KG + KG - 1, copies 1.. leave their values in shared memory and copy 0
// adds them after its own, in ascending copy (= block) order.
//
// Layout: as linear_mma.cu (x f32 [M, K], w int8 [N, K], scale f32 [N], y and residual f32
// [M, N]; K % 64 == 0, N % (8 NT WN) == 0, 16-byte aligned rows).
// Thread mapping: threads 128 gk .. (for WM WN = 4) form copy gk; inside a copy warp (wm,
// wn) and lane 4 g + t as linear_mma.cu. Staging: a copy's threads copy, per block, the
// CTA's BM = 16 MT WM rows of x (16 chunks of 16 bytes each) and BN = 8 NT WN rows of codes
// (4 chunks each), zero-filling rows past M.
// Shared memory (dynamic): per copy S stages of xs[BM][16 chunks] (chunk q of row r at
// q ^ (((q >> 3) & 1) << 1) ^ (r & 1): a warp's float4 reads of rows g and k = 16 t + 4 j
// then hit 32 distinct banks per quarter warp) and ws[BN][64 bytes]; then, with KG > 1,
// (KG - 1) x WARPS x VALS x 32 floats of block values. PDL (pdl.cuh): the first S - 1
// blocks' codes are requested before cru_pdl_wait, x after it. No standard headers (NVRTC).
#include "mma_common.cuh"
#include "pdl.cuh"

#ifndef CRU_DYNAMIC_SMEM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

#ifndef CRU_HOST_SHIM
// 16 bytes global -> shared (cp.async, L1 bypassed); bytes = 0 writes 16 zero bytes.
__device__ __forceinline__ void cru_pipe_cp16(void* dst, const void* src, int bytes) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(at), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cru_pipe_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cru_pipe_wait() {  // all but the newest N groups landed
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
__device__ __forceinline__ void cru_pipe_cp16(void* dst, const void* src, int bytes) {
    if (bytes) __builtin_memcpy(dst, src, 16); else __builtin_memset(dst, 0, 16);
}
__device__ __forceinline__ void cru_pipe_commit() {}
template <int N>
__device__ __forceinline__ void cru_pipe_wait() {}
#endif

// Where chunk q (16 bytes, k = 4 q .. 4 q + 3 of the block) of staged x row r lives.
__device__ __forceinline__ int cru_pipe_xchunk(int r, int q) {
    return q ^ (((q >> 3) & 1) << 1) ^ (r & 1);
}

// Bytes of dynamic shared memory for a form (kernels/linear_mma.py mirrors it).
template <int MT, int NT, int WM, int WN, int S, int KG>
struct PipeSmem {
    static constexpr int BM = 16 * MT * WM, BN = 8 * NT * WN;
    static constexpr int STAGE = BM * 256 + BN * 64;  // bytes: x rows, then code rows
    static constexpr int VALS = KG > 1 ? (KG - 1) * WM * WN * MT * NT * 4 * 32 : 0;  // floats
    static constexpr int BYTES = KG * S * STAGE + 4 * VALS;
};

template <int MT, int NT, int WM, int WN, int S, int KG>
__global__ void __launch_bounds__(32 * WM * WN * KG)
linear_mma_pipe(const float* __restrict__ x, const signed char* __restrict__ w,
                const float* __restrict__ scale, const float* __restrict__ residual,
                float* __restrict__ y, int M, int N, int K) {
    using L = PipeSmem<MT, NT, WM, WN, S, KG>;
    constexpr int WARPS = WM * WN, VALS = MT * NT * 4, CT = 32 * WARPS;  // CT: a copy's threads
    CRU_DYNAMIC_SMEM(float4, smem4);
    unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % WARPS;
    const int gk = (int)threadIdx.x / CT, ct = (int)threadIdx.x % CT;
    const int g = lane >> 2, t = lane & 3, wm = warp / WN, wn = warp % WN;
    const int bm0 = blockIdx.y * L::BM, bn0 = blockIdx.x * L::BN;
    unsigned char* mine = smem + gk * S * L::STAGE;  // this copy's stages
    float* vals = reinterpret_cast<float*>(smem + KG * S * L::STAGE);
    const int nblocks = K / 64, rounds = (nblocks + KG - 1) / KG;

    // Stage round r's block (r KG + gk) into stage r % S: x rows, or with CODES the codes.
    auto stage = [&](int r, bool codes) {
        const int blk = r * KG + gk;
        if (r >= rounds || blk >= nblocks) return;
        unsigned char* st = mine + (r % S) * L::STAGE;
        const int kb = 64 * blk;
        if (codes) {
            for (int u = ct; u < L::BN * 4; u += CT) {
                const int row = u >> 2, q = u & 3;
                cru_pipe_cp16(st + L::BM * 256 + row * 64 + q * 16,
                              w + (size_t)(bn0 + row) * K + kb + 16 * q, 16);
            }
        } else {
            for (int u = ct; u < L::BM * 16; u += CT) {
                const int row = u >> 4, q = u & 15, m = bm0 + row;
                cru_pipe_cp16(st + row * 256 + cru_pipe_xchunk(row, q) * 16,
                              x + (size_t)(m < M ? m : 0) * K + kb + 4 * q, m < M ? 16 : 0);
            }
        }
    };
#pragma unroll 1
    for (int r = 0; r < S - 1; ++r) stage(r, true);  // weights: never written by a step
    cru_pdl_wait();
    cru_pdl_trigger();
#pragma unroll 1
    for (int r = 0; r < S - 1; ++r) {
        stage(r, false);
        cru_pipe_commit();  // group r (group 0 also holds the codes of the prologue)
    }

    float part[MT][NT][3][4], total[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int c = 0; c < NT; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                total[i][c][e] = part[i][c][0][e] = part[i][c][1][e] = part[i][c][2][e] = 0.0f;
#pragma unroll 1
    for (int r = 0; r < rounds; ++r) {
        cru_pipe_wait<S - 2>();  // round r's group has landed (this thread's copies)
        __syncthreads();         // everyone's, and round r - 1's stage is free again
        stage(r + S - 1, true);
        stage(r + S - 1, false);
        cru_pipe_commit();
        const int blk = r * KG + gk;
        if (blk < nblocks) {
            const unsigned char* st = mine + (r % S) * L::STAGE;
            const float* xs = reinterpret_cast<const float*>(st);
            int4 q[NT];
#pragma unroll
            for (int c = 0; c < NT; ++c)
                q[c] = *reinterpret_cast<const int4*>(st + L::BM * 256 +
                                                      (8 * (NT * wn + c) + g) * 64 + 16 * t);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                unsigned b[NT][2];
#pragma unroll
                for (int c = 0; c < NT; ++c) cru_codes_b(cru_word(q[c], j), b[c]);
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const int r0 = 16 * (MT * wm + i) + g, r1 = r0 + 8;
                    const float4 v0 = *reinterpret_cast<const float4*>(
                        xs + r0 * 64 + 4 * cru_pipe_xchunk(r0, 4 * t + j));
                    const float4 v1 = *reinterpret_cast<const float4*>(
                        xs + r1 * 64 + 4 * cru_pipe_xchunk(r1, 4 * t + j));
                    unsigned a[3][4];
                    cru_split_a(v0, v1, a);
#pragma unroll
                    for (int c = 0; c < NT; ++c) cru_mma3<false>(part[i][c], a, b[c]);
                }
            }
            float* out = vals + ((gk > 0 ? gk - 1 : 0) * WARPS + warp) * VALS * 32 + lane;
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int c = 0; c < NT; ++c)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (gk == 0)
                            total[i][c][e] = cru_block_add<false>(total[i][c][e], part[i][c], e);
                        else  // copy 0 adds it after its own block (below)
                            out[((i * NT + c) * 4 + e) * 32] = cru_block_value<false>(part[i][c], e);
                    }
        }
        if constexpr (KG > 1) {  // the round's other blocks, ascending, into copy 0's totals
            __syncthreads();
            if (gk == 0) {
                for (int o = 1; o < KG && r * KG + o < nblocks; ++o) {
                    const float* theirs = vals + ((o - 1) * WARPS + warp) * VALS * 32 + lane;
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int c = 0; c < NT; ++c)
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                total[i][c][e] = __fadd_rn(total[i][c][e],
                                                           theirs[((i * NT + c) * 4 + e) * 32]);
                }
            }
            // The next round's first barrier orders these reads before new values land.
        }
    }
    cru_pipe_wait<0>();  // no copy left in flight at exit
    if (gk != 0) return;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int c = 0; c < NT; ++c) {
            const int col = bn0 + 8 * (NT * wn + c) + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = bm0 + 16 * (MT * wm + i) + g + 8 * h;
                if (row < M)
                    cru_mma_store(y, residual, scale, row, col, N, total[i][c][2 * h],
                                  total[i][c][2 * h + 1]);
            }
        }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the built forms (kernels/linear_mma_pipe.py PIPE_FORMS)
// so `-Xptxas -v` reports their registers and spills.
#define CRU_MMA_PIPE(MT, NT, WM, WN, S, KG)                                                  \
    template __global__ void linear_mma_pipe<MT, NT, WM, WN, S, KG>(                         \
        const float*, const signed char*, const float*, const float*, float*, int, int, int);
CRU_MMA_PIPE(1, 4, 2, 2, 4, 1)
CRU_MMA_PIPE(1, 4, 2, 2, 3, 2)
CRU_MMA_PIPE(1, 4, 2, 2, 2, 3)
CRU_MMA_PIPE(1, 2, 1, 4, 3, 1)
CRU_MMA_PIPE(2, 4, 2, 2, 3, 1)
CRU_MMA_PIPE(2, 4, 4, 1, 3, 1)
#endif
