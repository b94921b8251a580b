// decode_stack.cu: the MLP of the batch-1 decode stack in one kernel, and the combine that
// ends the stack. Why: a batch-1 layer is five latency-bound kernels (QKV, attention, O,
// gate/up, down) and every kernel boundary costs about as much as a small kernel's work.
// The stack runs three per layer: linear_rows' QKV form (which also adds the previous
// layer's down partials), attn_decode<1, OW> (which also leaves O's chunk partials), and
// decode_mlp below. Each GEMM keeps linear.cu's canonical order, so the bits are those of
// the five-kernel layer (gpu-engine-check compares them).
//
// decode_mlp<T>: h = x + O's partials (cru_combined: the O GEMM's residual epilogue);
//   CTA (f, m) with f = blockIdx.x < F/64, m = blockIdx.y: RMSNorm(h) -> the 64 SwiGLU
//   outputs a = f*64 .. f*64+63 of row m (gate rows a, up rows F + a of w_gu [2F, K]) ->
//   down's partial of K chunk f for every down column n: the fma chain over those 64
//   outputs of swiglu[a] * w_down[n, a], ascending (rows_chunk.cuh's cru_slice_chains). The next
//   kernel (QKV of the next layer, or combine_rows after the last) adds the F/64 partials
//   in ascending f, so down's output needs no kernel of its own. CTA 0 of each row stores h.
// Layout: x, h_out [M, K]; o_parts [n_parts][M][K]; w_gu [2F, K] + s_gu [2F] (int8);
//   w_down [N_d, F]; down_parts [F/64][M][N_d]. Requires K % 16 == 0, K <= 576 and
//   F % 64 == 0 (crucible/backend/cupy_decode_stack.py checks).
// Thread mapping: block (32, 2 * n_chunks), n_chunks = ceil(K / 64). Warp y computes K
//   chunk c = y % n_chunks of half y / n_chunks (the 32 outputs a = f*64 + half*32 + lane:
//   lane's gate and up columns, linear_rows' SwiGLU column pair); warps c = 0 of each half
//   add the chunk partials in order and apply the scale and SwiGLU; then flat thread t
//   computes down columns t, t + threads, ... All weights and scales load before
//   cru_pdl_wait: the gate/up chunks in registers, the down chunks (N_d x 64) into shared
//   memory by cp.async; x and the partials after it.
// MMA (int8; CRUCIBLE_GEMM=mma): gate/up's and down's partials are their block values in
// the tensor-core order (mma_row.cuh), left where the fma chains go: warp (c, half) takes
// block c of its 32 gate and 32 up columns as 8 tiles (its lanes preload column g's 16
// codes 16 t .. of each), and warp w takes down's 8-column tiles w, w + warps, ... of the
// staged slice against the 64 SwiGLU outputs. The row's B fragments are split once per
// CTA into shared memory (cru_row_b_put: the normalised x by the norm's threads, the SwiGLU
// outputs by the finishers), not once per warp. Requires K % 64 == 0 and N_d % 16 == 0.
// decode_mlp_pair: the same over clusters of two CTAs a chunk (its comment below), grid
// (2 F/64, M), block (32, n_chunks); a pair needs N_d even (MMA: N_d % 32 == 0).
// Dynamic shared memory: 4 * (2K + 2 * n_chunks * 64 + 64) + N_d * 64 * sizeof(T), and
// under MMA 384 * (n_chunks + 1) more; the pair stages N_d / 2 columns and adds 64 bytes
// at the head. No standard headers (NVRTC).
#include "cluster.cuh"
#include "mma_row.cuh"
#include "pdl.cuh"
#include "rows_chunk.cuh"
#include "rowops.cuh"

// The MLP of one CTA (SPLIT 1: decode_mlp) or of one CTA of a pair (SPLIT 2:
// decode_mlp_pair, rank s of a cluster of two): the CTA's warps take gate/up half `half`
// (SPLIT 2: half s only), and its down columns are s * N_d / SPLIT .. of the next N_d /
// SPLIT. A pair hands each other its 32 SwiGLU outputs (and under MMA their B words)
// through distributed shared memory, so both hold all 64 before down. red: 9 floats of
// shared memory (8 warp partials, then 1 / rms).
template <typename T, bool MMA, int SPLIT>
__device__ __forceinline__ void cru_mlp(const float* x, const float* o_parts, int n_parts,
                                        const float* o_scale, float* h_out,
                                        const float* norm_w, float eps, const T* w_gu,
                                        const float* s_gu, const T* w_down, float* down_parts,
                                        int M, int K, int F, int N_d, float* smem, float* red) {
    const int n_chunks = (K + CRU_KC - 1) / CRU_KC;
    float* xs = smem;                        // [K]: h, then its norm
    float* nw = xs + K;                      // [K]: the norm weight
    float* part = nw + K;                    // [2 halves][n_chunks][2 (gate, up)][32]
    float* act = part + 2 * n_chunks * 64;   // [64]: the SwiGLU outputs
    // MMA: the B fragments of the normalised x's blocks, then of act (cru_row_b_put).
    unsigned* bw = reinterpret_cast<unsigned*>(act + 64);  // [n_chunks + 1][96]
    unsigned* bw_act = bw + 96 * n_chunks;
    const unsigned s = SPLIT == 2 ? cru_cluster_rank() : 0u;
    const int lane = threadIdx.x, c = threadIdx.y % n_chunks;
    const int half = SPLIT == 2 ? (int)s : threadIdx.y / n_chunks;
    const int tid = threadIdx.y * 32 + lane, nthreads = 32 * blockDim.y;
    const int f = blockIdx.x / SPLIT, m = blockIdx.y;
    const int cb = 2 * f + half;  // linear_rows' SwiGLU column block of this warp's outputs
    const int nd = N_d / SPLIT, col0 = (int)s * nd;  // this CTA's down columns
    static_assert(!MMA || sizeof(T) == 1, "the mma order takes int8 weights");

    // Weights first: this warp's gate/up chunk, this thread's down chunk, the scales.
    RawChunk<T> raw[2];
    const bool whole = K - c * CRU_KC >= CRU_KC;
    if constexpr (MMA) {  // tile n < 4: gate columns cb * 32 + 8 n + g; n >= 4: up's
#pragma unroll
        for (int n = 0; n < 8; ++n)
            raw[n >> 2].v[n & 3] = __ldg(reinterpret_cast<const int4*>(
                w_gu + (long)((n >> 2) * F + cb * 32 + 8 * (n & 3) + (lane >> 2)) * K +
                c * CRU_KC + 16 * (lane & 3)));
    } else if (whole) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
            raw[j].load(w_gu + (long)cru_rows_col<1>(cb, j, lane, F) * K + c * CRU_KC);
    }
    // Down's chunk f of this CTA's columns: to shared memory (registers would spill), in
    // flight through the wait, the norm and gate/up.
    // [piece][nd] (cru_stage_slice), after the fragments under MMA
    int4* wd_s = reinterpret_cast<int4*>(bw + (MMA ? 96 * (n_chunks + 1) : 0));
    cru_stage_slice<T>(wd_s, w_down + (long)col0 * F, F, f * CRU_KC, nd, tid, nthreads);
    if constexpr (SPLIT == 2) cru_cluster_arrive();  // this CTA runs (waited for below)
    const bool finisher = c == 0;
    EpiIn<2> e;
    if (finisher)
        e = cru_epi_load<T, 2, 1>(cb, m, lane, F, 2 * F, s_gu, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, 0, 0, 0);
    for (int k = tid; k < K; k += nthreads) nw[k] = norm_w[k];
    cru_pdl_wait();  // above: weights only; below: x and the partials (pdl.cuh)
    cru_pdl_trigger();

    for (int k = tid; k < K; k += nthreads) {
        float v[1];
        cru_combined<T, 1>(x, o_parts, n_parts, o_scale, M, m, K, k, 0, v);
        xs[k] = v[0];
        if (f == 0 && s == 0) h_out[(long)m * K + k] = v[0];
    }
    __syncthreads();
    cru_rows_sumsq(xs, 1, K, red);
    if (tid == 0) red[8] = cru_inv_rms(cru_rows_total(red, 0), K, eps);
    __syncthreads();
    const float inv = red[8];
    if constexpr (MMA) {  // the normalised x only as B fragments: each pair split once
        for (int i = tid; i < K / 2; i += nthreads)
            cru_row_b_put(bw + 96 * (i >> 5), i & 31, cru_norm_apply(xs[2 * i], inv, nw[2 * i]),
                          cru_norm_apply(xs[2 * i + 1], inv, nw[2 * i + 1]));
    } else {
        for (int k = tid; k < K; k += nthreads) xs[k] = cru_norm_apply(xs[k], inv, nw[k]);
    }
    __syncthreads();

    float* my_part = part + half * n_chunks * 64;
    if constexpr (MMA) {  // gate's 32 columns, then up's, at my_part[(c * 2 + j) * 32 + l]
        unsigned b[4][2];
        cru_row_b_get(bw + 96 * c, lane, b);
        cru_row_tiles8(raw, b, my_part + c * 64, lane);
    } else {
        cru_rows_chunk<T, 1, 2, 1>(raw, whole, w_gu, xs, my_part, cb, c, lane, K, F, 2 * F);
    }
    __syncthreads();
    if constexpr (SPLIT == 2) cru_cluster_wait();  // the peer runs: its memory may be written
    if (finisher) {  // linear_rows' SwiGLU epilogue, into shared memory (a pair: both CTAs')
        float v[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float total = my_part[j * 32 + lane];
            for (int cc = 1; cc < n_chunks; ++cc)
                total = __fadd_rn(total, my_part[(cc * 2 + j) * 32 + lane]);
            v[j] = cru_rows_finish<T>(total, e.sc[j]);
        }
        const float a = cru_swiglu(v[0], v[1]);
        act[half * 32 + lane] = a;
        if constexpr (SPLIT == 2) cru_st_peer(act + half * 32 + lane, s ^ 1u, __float_as_uint(a));
        if constexpr (MMA) {  // the pair (a, next lane's) as down's B fragments, once
            const float next = __shfl_down_sync(0xffffffffu, a, 1);
            const int i = (half * 32 + lane) >> 1;
            unsigned w[3];
            cru_row_b_words(a, next, w);
            if ((lane & 1) == 0) {
#pragma unroll
                for (int p = 0; p < 3; ++p) {
                    bw_act[32 * p + i] = w[p];
                    if constexpr (SPLIT == 2) cru_st_peer(bw_act + 32 * p + i, s ^ 1u, w[p]);
                }
            }
        }
    }
    cru_cp_wait_all();
    if constexpr (SPLIT == 2) {  // both CTAs' act and every thread's down pieces are visible
        cru_cluster_arrive();
        cru_cluster_wait();
    } else {
        __syncthreads();  // act and every thread's down pieces are visible
    }
    float* out = down_parts + ((long)f * M + m) * N_d + col0;
    if constexpr (MMA) {
        unsigned b[4][2];
        cru_row_b_get(bw_act, lane, b);
        cru_row_slice(wd_s, nd, b, out, tid >> 5, nthreads >> 5, lane);
    } else {
        for (int n = tid; n < nd; n += nthreads) {
            const int cols[1] = {n};
            float acc[1];
            cru_slice_chains<T, 1>(wd_s, nd, cols, act, acc);
            out[n] = acc[0];
        }
    }
}

// 576 threads at most (K <= 576): 96 registers hold both gate/up chunks through the
// combine's 24 loads in flight; at 768 threads' 80 they spilled 20 bytes.
template <typename T, bool MMA = false>
__global__ void __launch_bounds__(576, 1)
decode_mlp(const float* __restrict__ x, const float* __restrict__ o_parts, int n_parts,
           const float* __restrict__ o_scale, float* __restrict__ h_out,
           const float* __restrict__ norm_w, float eps, const T* __restrict__ w_gu,
           const float* __restrict__ s_gu, const T* __restrict__ w_down,
           float* __restrict__ down_parts, int M, int K, int F, int N_d) {
    CRU_DYNAMIC_SMEM(float4, mlp_smem4);  // float4: 16-byte aligned for the vector reads
    __shared__ float red[9];
    cru_mlp<T, MMA, 1>(x, o_parts, n_parts, o_scale, h_out, norm_w, eps, w_gu, s_gu, w_down,
                       down_parts, M, K, F, N_d, reinterpret_cast<float*>(mlp_smem4), red);
}

// The same MLP over a cluster of two CTAs a chunk: at batch 1 the 24 CTAs of decode_mlp
// leave 108 of the H200's 132 SMs idle while each walks 128 gate/up columns and all of
// down's; a pair halves each CTA's weights and work for one exchange of 64 values. The
// bits are decode_mlp's: every output element is computed by the same code in the same
// order, only by another CTA. Grid (2 F/64, M), block (32, n_chunks); red and inv sit at
// the head of the dynamic shared memory (16 floats), so the host shim can run two CTAs at
// once (it turns __shared__ into statics).
template <typename T, bool MMA = false>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(288, 1)
decode_mlp_pair(const float* __restrict__ x, const float* __restrict__ o_parts, int n_parts,
                const float* __restrict__ o_scale, float* __restrict__ h_out,
                const float* __restrict__ norm_w, float eps, const T* __restrict__ w_gu,
                const float* __restrict__ s_gu, const T* __restrict__ w_down,
                float* __restrict__ down_parts, int M, int K, int F, int N_d) {
    CRU_DYNAMIC_SMEM(float4, mlp_smem4);
    float* smem = reinterpret_cast<float*>(mlp_smem4);
    cru_mlp<T, MMA, 2>(x, o_parts, n_parts, o_scale, h_out, norm_w, eps, w_gu, s_gu, w_down,
                       down_parts, M, K, F, N_d, smem + 16, smem);
}

// combine_rows<T>: y = x + the F/64 down partials the last decode_mlp left (cru_combined),
// the residual stream after the last layer. One CTA of 256 threads per row; element k of
// row m is thread k % 256's. Launched with PDL like the kernels around it.
template <typename T>
__global__ void __launch_bounds__(256)
combine_rows(const float* __restrict__ x, const float* __restrict__ parts, int n_parts,
             const float* __restrict__ scale, float* __restrict__ y, int M, int K) {
    cru_pdl_wait();
    cru_pdl_trigger();
    const int m = blockIdx.x, step = blockDim.x;
    for (int k0 = threadIdx.x; k0 < K; k0 += 3 * step) {  // three elements' loads at once
        float v[3];
        cru_combined<T, 3>(x, parts, n_parts, scale, M, m, K, k0, step, v);
#pragma unroll
        for (int i = 0; i < 3; ++i)
            if (k0 + i * step < K) y[(long)m * K + k0 + i * step] = v[i];
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate what the host launches, so `-Xptxas -v` reports it.
template __global__ void decode_mlp<signed char>(const float*, const float*, int, const float*,
                                                 float*, const float*, float,
                                                 const signed char*, const float*,
                                                 const signed char*, float*, int, int, int,
                                                 int);
template __global__ void decode_mlp<float>(const float*, const float*, int, const float*,
                                           float*, const float*, float, const float*,
                                           const float*, const float*, float*, int, int, int,
                                           int);
template __global__ void decode_mlp<signed char, true>(const float*, const float*, int,
                                                       const float*, float*, const float*,
                                                       float, const signed char*,
                                                       const float*, const signed char*, float*,
                                                       int, int, int, int);
#define CRU_MLP_PAIR(T, MMA)                                                                \
    template __global__ void decode_mlp_pair<T, MMA>(const float*, const float*, int,        \
                                                     const float*, float*, const float*,     \
                                                     float, const T*, const float*, const T*, \
                                                     float*, int, int, int, int);
CRU_MLP_PAIR(signed char, false)
CRU_MLP_PAIR(signed char, true)
CRU_MLP_PAIR(float, false)
template __global__ void combine_rows<signed char>(const float*, const float*, int,
                                                   const float*, float*, int, int);
template __global__ void combine_rows<float>(const float*, const float*, int, const float*,
                                             float*, int, int);
#endif
