// linear_rows.cu: the decode GEMM, y[m, n] = sum_k x[m, k] * W[n, k], fused with the row
// stages around it. Same canonical order, so the same bits, as linear.cu's kernels.
//
// Layout: x f32 [M, K] row-major; weights in their natural [N, K] row-major form (f32, or
// int8 codes with f32 scale[N]), so one thread reads one column's 64-wide K chunk as
// contiguous 16-byte vectors (4 loads for int8, 16 for f32) instead of 64 strided loads;
// y f32 [M, N_out] row-major.
//
// Canonical order of every output element (the contract of linear.cu, restated):
//   partial_c = sequential fma chain over the 64-wide chunk c from 0 (k ascending);
//   total = partial_0 + partial_1 + ... in ascending c; int8: total * scale[n];
//   residual (when given): residual[m, n] + that, last.
//
// Thread mapping: block (32, Y), Y = max(n_chunks, 8) <= 24 (so K <= 1536). The one-row
// SwiGLU and RoPE forms are bounded at 12 warps (K <= 768): a thread keeps its two columns'
// chunks in up to 168 registers instead of spilling ~600 bytes at the 80 that 768 threads
// allow. Multi-row forms keep 768 (80 registers, two CTAs per SM beat a spill-free one). threadIdx.y = c
// owns K chunk c; lane owns NC output columns (below) of a column block. MT rows per block,
// grid.y walks row groups; rows past M are zeros and never stored. Every thread first
// stages the MT rows of x in shared memory (and normalises them in place when PRO is set);
// then for each of the block's `groups` consecutive column blocks, each chunk's partials go
// through shared memory and warp y adds row y's partials in chunk order. Several column
// blocks per CTA amortise the staging and the norm when N is large (the LM head); the next
// block's int8 weights and epilogue inputs load while the current block is finished.
//
// Prologue PRO: 0 none; 1 RMSNorm (rowops.cuh's canonical tree; flat threads 0..255).
// Epilogue EPI (the columns a lane owns):
//   0 store   column blockIdx.x*32 + lane           -> y (+ residual)
//   1 swiglu  columns f and F + f (f = blockIdx.x*32 + lane) of the [2F, K] gate/up
//             weight -> y[m, f] = swiglu(gate, up)
//   2 rope    blockIdx.x = one head of the fused QKV output (Q heads, then K, then V);
//             columns j = lane and j + 32 of that head (head_dim 64). Q heads are rotated
//             into q_out [M, H*64], K heads rotated into the K pool, V heads copied to the
//             V pool, each at (pages[m], slots[m]) of `layer`.
// Combine (MT = 1, EPI 1 or 2 only: the batch-1 decode stack, rows_chunk.cuh): with
// n_parts > 0, the staged x is x + the previous GEMM's n_parts chunk partials
// [n_parts][M][K], finished as that GEMM's residual epilogue (pscale: its int8 scales);
// column block 0 also stores that x to x_out, the residual stream's next value.
// Gather (the same forms, the stack's first layer): with g_ids set, x is the embedding table
// and row m0's x is table row (g_feed && g_feed[m0] >= 0 ? g_fed[g_feed[m0]] : g_ids[m0]),
// as model_ops.cu's embed_fed picks it; column block 0 stores it to x_out. This replaces the
// embedding kernel: the first kernel of a decode graph has no kernel to overlap with.
// MMA (int8, one row, RoPE form: the decode stack's QKV under CRUCIBLE_GEMM=mma): warp c
// computes block c of the head's 64 columns in the tensor-core order instead (mma_row.cuh:
// 8 tiles of 8 columns), leaving the block value where the fma form leaves its chain; the
// finisher is the same, so the bits are linear_mma_rows' (norm fused, then RoPE + store).
// Here w is the codes as bf16 (DeviceWeight.wb, [N, K] uint16), and a column block is half
// a head: block cb is head cb / 2's RoPE pairs (j, j + 32) for j = 16 (cb % 2) .. + 15,
// i.e. its 16-column pairs cb % 2 and cb % 2 + 2 (twice the CTAs of one a head, each with
// half the codes and half the work: at batch 1 the 15 CTAs of the head form left the GPU
// idle). Each warp stages its block's four tiles into shared memory before the wait
// (cru_stage_tiles_bf: 4 KB a warp; the next column block's while this one is finished),
// and lanes 0..15 of the finisher take the block's pairs.
// PDL (pdl.cuh): the first column block's weights and epilogue inputs, and the norm weight,
// load before cru_pdl_wait; x, the partials and the residual after it.
// Dynamic shared memory: 4 * (MT*K + n_chunks*MT*NC*32 + K), and under MMA 4096 * n_chunks
// more (the staged codes). No standard headers (NVRTC).
#include "mma_row.cuh"
#include "pdl.cuh"
#include "rows_chunk.cuh"
#include "rowops.cuh"

template <typename T, int MT, int PRO, int EPI, bool MMA = false>
__global__ void __launch_bounds__((EPI != 0 && MT == 1) ? 384 : 768, 1)
linear_rows(const float* __restrict__ x, const T* __restrict__ w,
            const float* __restrict__ scale, const float* __restrict__ norm_w, float eps,
            const float* __restrict__ residual, float* __restrict__ y, int M, int N_out, int K,
            int groups, const int* __restrict__ positions, const int* __restrict__ pages,
            const int* __restrict__ slots, const float* __restrict__ cos_t,
            const float* __restrict__ sin_t, float* __restrict__ k_pool,
            float* __restrict__ v_pool, int layer, int n_layers, int n_heads, int n_kv,
            const float* __restrict__ parts, int n_parts, const float* __restrict__ pscale,
            float* __restrict__ x_out, const int* __restrict__ g_ids,
            const int* __restrict__ g_feed, const int* __restrict__ g_fed) {
    constexpr int NC = EPI == 0 ? 1 : 2;
    CRU_DYNAMIC_SMEM(float, smem);  // rows_chunk.cuh: the host shim maps it too
    __shared__ float red[MT * 8];
    __shared__ float inv[MT];
    const int n_chunks = (K + CRU_KC - 1) / CRU_KC;
    float* xs = smem;                            // [MT][K]
    float* part = smem + MT * K;                 // [n_chunks][MT][NC][32]
    float* nw = part + n_chunks * MT * NC * 32;  // [K] (PRO only): the norm weight
    int4* tiles = reinterpret_cast<int4*>(nw + K);  // MMA: [n_chunks][256] staged codes
    const int lane = threadIdx.x, c = threadIdx.y;
    const int tid = c * 32 + lane, nthreads = 32 * blockDim.y;
    const int m0 = blockIdx.y * MT;
    // Rows of the weight: N_out, or 2F for SwiGLU, or the QKV width for RoPE.
    const int n_rows_w = EPI == 1 ? 2 * N_out : N_out;
    const int n_blocks = EPI == 2 ? (n_heads + 2 * n_kv) * (MMA ? 2 : 1) : (N_out + 31) / 32;
    // The finisher's column block and lane: MMA's half heads map to their head and to the
    // lane that owns RoPE pair j = 16 (cb % 2) + lane % 16 of it (lanes 16.. repeat 0..15).
    auto head_of = [](int cb) { return MMA ? cb >> 1 : cb; };
    auto lane_of = [&](int cb) { return MMA ? 16 * (cb & 1) + (lane & 15) : lane; };
    static_assert(!MMA || (sizeof(T) == 1 && MT == 1 && EPI == 2),
                  "the mma form is the stack's int8 one-row QKV");

    // The first column block's int8 weights and epilogue inputs load while x is staged and
    // normalised.
    RawChunk<T> raw[NC];
    const int cb0 = blockIdx.x * groups;
    // Whether this thread's chunk is a whole vector chunk (the only kind raw[] serves).
    const bool whole = c < n_chunks && K - c * CRU_KC >= CRU_KC && (K & 15) == 0;
    auto load_raw = [&](int cb) {
#pragma unroll
        for (int j = 0; j < NC; ++j) {
            const int col = cru_rows_col<EPI>(cb, j, lane, N_out);
            if (col < n_rows_w) raw[j].load(w + (long)col * K + c * CRU_KC);
        }
    };
    // MMA: staged tile i of half head cb is the head's tile 2 (cb % 2) + i % 2 + 4 (i / 2)
    // (its pairs cb % 2 and cb % 2 + 2); column g of it for this lane.
    auto stage = [&](int cb) {
        cru_stage_tiles_bf<4>(tiles + 256 * c, reinterpret_cast<const unsigned short*>(w), K,
                              (long)c * CRU_KC, [&](int i) {
            return (cb >> 1) * 64 + 8 * (2 * (cb & 1) + (i & 1) + 4 * (i >> 1)) + (lane >> 2);
        }, lane);
    };
    if (whole) {
        if constexpr (MMA) stage(cb0);
        else load_raw(cb0);
    }
    const int kv_dim = n_kv * 64;
    const bool finisher = c < MT && m0 + c < M;  // warp c finishes row m0 + c
    EpiIn<NC> e0;
    if (finisher)
        e0 = cru_epi_load<T, NC, EPI>(head_of(cb0), m0 + c, lane_of(cb0), N_out, n_rows_w,
                                      scale, positions, pages, slots, cos_t, sin_t, n_layers,
                                      layer, kv_dim);
    if (PRO == 1)
        for (int k = tid; k < K; k += nthreads) nw[k] = norm_w[k];
    // Above: weights, scales, tables and metadata only. Below: x and the residual, which the
    // step's previous kernels wrote (pdl.cuh).
    cru_pdl_wait();
    cru_pdl_trigger();
    if (finisher) e0.res = cru_epi_res<EPI>(head_of(cb0), m0 + c, lane_of(cb0), N_out, residual);
    // The combine is compiled into the one-row SwiGLU and RoPE forms only: their 384-thread
    // bounds leave registers for 48 loads in flight; the 768-thread ones would spill.
    if (MT == 1 && EPI != 0 && g_ids != nullptr) {  // gather: no partials to add
        const int f = g_feed != nullptr ? g_feed[m0] : -1;
        const float* xr = x + (long)(f >= 0 ? g_fed[f] : g_ids[m0]) * K;
        for (int k = tid; k < K; k += nthreads) {
            const float v = xr[k];
            xs[k] = v;
            if (x_out != nullptr && blockIdx.x == 0) x_out[(long)m0 * K + k] = v;
        }
    } else if (MT == 1 && EPI != 0) {
        for (int k0 = tid; k0 < K; k0 += 2 * nthreads) {  // two elements' loads at once
            float v[2];
            cru_combined<T, 2>(x, parts, n_parts, pscale, M, m0, K, k0, nthreads, v);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int k = k0 + i * nthreads;
                if (k >= K) break;
                xs[k] = v[i];
                if (x_out != nullptr && blockIdx.x == 0) x_out[(long)m0 * K + k] = v[i];
            }
        }
    } else {
        for (int r = 0; r < MT; ++r) {
            const bool live = m0 + r < M;
            for (int k = tid; k < K; k += nthreads)
                xs[r * K + k] = live ? x[(long)(m0 + r) * K + k] : 0.0f;
        }
    }
    __syncthreads();
    if (PRO == 1) {
        cru_rows_sumsq(xs, MT, K, red);
        if (tid < MT) inv[tid] = cru_inv_rms(cru_rows_total(red, tid), K, eps);
        __syncthreads();
        for (int r = 0; r < MT; ++r)
            for (int k = tid; k < K; k += nthreads)
                xs[r * K + k] = cru_norm_apply(xs[r * K + k], inv[r], nw[k]);
        __syncthreads();
    }

    for (int g = 0; g < groups; ++g) {
        const int cb = cb0 + g;
        if (cb >= n_blocks) break;  // uniform across the block
        const bool more = g + 1 < groups && cb + 1 < n_blocks;
        if constexpr (MMA) {
            if (c < n_chunks) {  // K % 64 == 0; one warp a block, so it splits x itself
                unsigned b[4][2];
                cru_row_b(xs + 64 * c, lane, b);
                cru_cp_wait_all();  // this lane's own staged codes
                cru_row_tiles_bf<4>(tiles + 256 * c, b, part + c * 64, lane, cb & 1, 2);
            }
        } else if (c < n_chunks) {
            cru_rows_chunk<T, MT, NC, EPI>(raw, whole, w, xs, part, cb, c, lane, K, N_out,
                                           n_rows_w);
        }
        // The next column block's weights load while this one's partials are summed.
        // (MMA: each lane restages only the slots it has just read, so no barrier first.)
        if (more && whole) {
            if constexpr (MMA) stage(cb + 1);
            else load_raw(cb + 1);
        }
        __syncthreads();
        if (finisher) {  // blockDim.y >= 8 >= MT: one warp per row
            const int r = c, m = m0 + r;
            const EpiIn<NC> e = e0;
            const int hb = head_of(cb), ln = lane_of(cb);
            float v[NC];
            bool ok = !MMA || lane < 16;
#pragma unroll
            for (int j = 0; j < NC; ++j) {
                ok = ok && cru_rows_col<EPI>(hb, j, ln, N_out) < n_rows_w;
                float total = part[(r * NC + j) * 32 + ln];
                for (int cc = 1; cc < n_chunks; ++cc)
                    total = __fadd_rn(total, part[((cc * MT + r) * NC + j) * 32 + ln]);
                v[j] = cru_rows_finish<T>(total, e.sc[j]);
            }
            if (ok && EPI == 0) {
                const long at = (long)m * N_out + cb * 32 + lane;
                y[at] = residual ? __fadd_rn(e.res, v[0]) : v[0];
            } else if (ok && EPI == 1) {
                y[(long)m * N_out + cb * 32 + lane] = cru_swiglu(v[0], v[1]);
            } else if (ok && EPI == 2) {
                if (hb < n_heads + n_kv) {
                    const float2 rr = cru_rope(v[0], v[1], e.cs, e.sn);
                    float* dst = hb < n_heads ? y + (long)m * n_heads * 64 + hb * 64
                                              : k_pool + e.base + (hb - n_heads) * 64;
                    dst[ln] = rr.x;
                    dst[ln + 32] = rr.y;
                } else {
                    float* dst = v_pool + e.base + (hb - n_heads - n_kv) * 64;
                    dst[ln] = v[0];
                    dst[ln + 32] = v[1];
                }
            }
            if (more) {  // the next block's epilogue inputs, in flight through its GEMM
                e0 = cru_epi_load<T, NC, EPI>(head_of(cb + 1), m, lane_of(cb + 1), N_out,
                                              n_rows_w, scale, positions, pages, slots, cos_t,
                                              sin_t, n_layers, layer, kv_dim);
                e0.res = cru_epi_res<EPI>(head_of(cb + 1), m, lane_of(cb + 1), N_out, residual);
            }
        }
        __syncthreads();  // part is rewritten by the next column block
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the decode shapes so `-Xptxas -v` reports their
// resources; NVRTC instantiates what it needs through name expressions instead.
#define CRU_ROWS_INSTANTIATE(T, MT, PRO, EPI)                                                  \
    template __global__ void linear_rows<T, MT, PRO, EPI>(                                     \
        const float*, const T*, const float*, const float*, float, const float*, float*, int, \
        int, int, int, const int*, const int*, const int*, const float*, const float*, float*, \
        float*, int, int, int, int, const float*, int, const float*, float*, const int*,        \
        const int*, const int*);
CRU_ROWS_INSTANTIATE(signed char, 1, 1, 2)
CRU_ROWS_INSTANTIATE(signed char, 1, 1, 1)
CRU_ROWS_INSTANTIATE(signed char, 1, 0, 0)
CRU_ROWS_INSTANTIATE(signed char, 8, 0, 0)
CRU_ROWS_INSTANTIATE(float, 8, 1, 1)
template __global__ void linear_rows<signed char, 1, 1, 2, true>(
    const float*, const signed char*, const float*, const float*, float, const float*, float*,
    int, int, int, int, const int*, const int*, const int*, const float*, const float*, float*,
    float*, int, int, int, int, const float*, int, const float*, float*, const int*, const int*,
    const int*);
#endif
