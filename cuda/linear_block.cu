// linear_block.cu: the GEMM for batches of 16..128 rows, y[m, n] = sum_k x[m, k] * W[n, k],
// with the same fused stages as linear_rows.cu and the same canonical order, so the same
// bits (linear.cu states the order: 64-wide K chunks as sequential fma chains from 0, chunk
// totals added in ascending order, int8 totals times scale[n], the residual added last).
//
// Why another kernel: linear_rows gives each lane one column and re-reads x from shared
// memory for every column, one float4 per 4 fmas; at 64 rows it is bound by those loads
// and by its occupancy. Here each lane holds a 4 x 4 register tile: per k, one float4 of x
// and one of w feed 16 fmas.
//
// Layout: x f32 [M, K] row-major; W in its natural [N, K] form (f32, or int8 codes with
// f32 scale[N]); y f32 [M, N_out]. K <= 768 and K % 16 == 0 (the host checks).
//
// Thread mapping: grid (column tiles, row tiles of 16); block (32, n_chunks): warp c owns
// K chunk c. A CTA stages its 16 rows of x as xs[k][20] (transposed, RMSNorm applied in
// place when PRO = 1, rowops.cuh's canonical tree) and its 32 weight columns as ws[k][36]
// (int8 unpacked exactly to f32). Lane (rg = lane / 8, cg = lane % 8) forms the chunk
// partials of rows 4rg..4rg+3 x tile columns 4cg..4cg+3 (16 sequential chains); partials
// go through shared memory (reusing the staging space), and each output's chunks are
// added in ascending order by one thread, which applies the epilogue.
//
// Tile columns t = 0..31 of column tile cb (EPI as in linear_rows.cu):
//   0 store   weight column cb*32 + t                   -> y (+ residual)
//   1 swiglu  t < 16: gate f = cb*16 + t; t >= 16: up F + cb*16 + t - 16
//             -> y[m, f] = swiglu(gate, up) for the pairs (t, t + 16)
//   2 rope    head h = cb / 2, j0 = 16 * (cb % 2): t < 16: dim j0 + t; t >= 16: dim
//             32 + j0 + t - 16 of head h (Q heads, then K, then V): the pairs (t, t + 16) are
//             RoPE's (j, j + 32); Q rotated into q_out, K rotated / V copied into the pools.
// PDL (pdl.cuh): weights, scales and the norm weight stage before cru_pdl_wait; x, the
// residual and the epilogue's metadata reads after it.
// Dynamic shared memory: 4 * (K * (20 + 36) + K). No standard headers (NVRTC).
#include "gemm_common.cuh"
#include "pdl.cuh"
#include "rowops.cuh"

#define CRU_BM 16  // rows per CTA
#define CRU_BN 32  // weight columns per CTA
#define CRU_XS 20  // xs pitch (floats): 16-byte aligned, 4-way at worst on the staging stores
#define CRU_WS 36  // ws pitch (floats): 16-byte aligned

template <int EPI>
__device__ __forceinline__ int cru_block_col(int cb, int t, int F) {
    if (EPI == 2) return (cb >> 1) * 64 + (t >= 16 ? 32 : 0) + (cb & 1) * 16 + (t & 15);
    if (EPI == 1) return (t >= 16 ? F : 0) + cb * 16 + (t & 15);
    return cb * CRU_BN + t;
}

template <typename T, int PRO, int EPI>
__global__ void __launch_bounds__(384, 1)
linear_block(const float* __restrict__ x, const T* __restrict__ w,
             const float* __restrict__ scale, const float* __restrict__ norm_w, float eps,
             const float* __restrict__ residual, float* __restrict__ y, int M, int N_out,
             int K, const int* __restrict__ positions, const int* __restrict__ pages,
             const int* __restrict__ slots, const float* __restrict__ cos_t,
             const float* __restrict__ sin_t, float* __restrict__ k_pool,
             float* __restrict__ v_pool, int layer, int n_layers, int n_heads, int n_kv) {
    extern __shared__ float4 blk_smem4[];
    float* xs = reinterpret_cast<float*>(blk_smem4);  // [K][CRU_XS]
    float* ws = xs + K * CRU_XS;                        // [K][CRU_WS]
    float* nw = ws + K * CRU_WS;                        // [K] (PRO only)
    float* part = xs;  // [n_chunks][16][32], after the chunk loop (staging is then dead)
    __shared__ float red[CRU_BM * 8];
    __shared__ float inv[CRU_BM];
    const int lane = threadIdx.x, c = threadIdx.y, n_chunks = blockDim.y;
    const int tid = c * 32 + lane, nthreads = 32 * n_chunks;
    const int cb = blockIdx.x, m0 = blockIdx.y * CRU_BM;
    const int n_rows_w = EPI == 1 ? 2 * N_out : N_out;

    // Weights: lane t stages column t's 16-value piece k16 (a 16-byte int8 load), so the
    // 32 lanes' shared stores fall in 32 distinct banks.
    for (int e = tid; e < CRU_BN * (K / 16); e += nthreads) {
        const int t = e & 31, k16 = e >> 5;
        const int col = cru_block_col<EPI>(cb, t, N_out);
        float f[16];
        if (col < n_rows_w) {
            if (sizeof(T) == 1) {
                const int4 v = reinterpret_cast<const int4*>(
                    reinterpret_cast<const signed char*>(w) + (long)col * K)[k16];
                cru_unpack(v.x, f); cru_unpack(v.y, f + 4);
                cru_unpack(v.z, f + 8); cru_unpack(v.w, f + 12);
            } else {
                const float4* p = reinterpret_cast<const float4*>(
                    reinterpret_cast<const float*>(w) + (long)col * K) + 4 * k16;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float4 v = p[i];
                    f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) f[i] = 0.0f;  // a column past N: never stored
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) ws[(16 * k16 + i) * CRU_WS + t] = f[i];
    }
    if (PRO == 1)
        for (int k = tid; k < K; k += nthreads) nw[k] = norm_w[k];
    cru_pdl_wait();  // above: weights only; below: x and the residual (pdl.cuh)
    cru_pdl_trigger();
    for (int e = tid; e < CRU_BM * K; e += nthreads) {
        const int r = e / K, k = e - r * K;
        xs[k * CRU_XS + r] = m0 + r < M ? x[(long)(m0 + r) * K + k] : 0.0f;
    }
    __syncthreads();
    if (PRO == 1) {
        cru_rows_sumsq(xs, CRU_BM, K, red, 1, CRU_XS);
        if (tid < CRU_BM) inv[tid] = cru_inv_rms(cru_rows_total(red, tid), K, eps);
        __syncthreads();
        for (int e = tid; e < CRU_BM * K; e += nthreads) {
            const int k = e >> 4, r = e & 15;
            xs[k * CRU_XS + r] = cru_norm_apply(xs[k * CRU_XS + r], inv[r], nw[k]);
        }
        __syncthreads();
    }

    // Chunk c's partials: 16 chains of ascending k, one float4 of x and one of w per k.
    const int rg = lane >> 3, cg = lane & 7, k0 = c * CRU_KC, kn = min(CRU_KC, K - k0);
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int kk = 0; kk < kn; ++kk) {
        const float4 a = *reinterpret_cast<const float4*>(xs + (k0 + kk) * CRU_XS + 4 * rg);
        const float4 b = *reinterpret_cast<const float4*>(ws + (k0 + kk) * CRU_WS + 4 * cg);
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();  // every warp is done with xs / ws: part reuses them
#pragma unroll
    for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(part + (c * CRU_BM + 4 * rg + i) * CRU_BN + 4 * cg) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    __syncthreads();

    // One thread per output (EPI 0) or output pair (1, 2): chunk totals in ascending order.
    const int per_row = EPI == 0 ? CRU_BN : CRU_BN / 2;
    for (int o = tid; o < CRU_BM * per_row; o += nthreads) {
        const int r = o / per_row, t = o - r * per_row, m = m0 + r;
        if (m >= M) continue;
        float v[2];
#pragma unroll
        for (int h = 0; h < (EPI == 0 ? 1 : 2); ++h) {
            const int tt = t + 16 * h, col = cru_block_col<EPI>(cb, tt, N_out);
            float total = part[r * CRU_BN + tt];
            for (int cc = 1; cc < n_chunks; ++cc)
                total = __fadd_rn(total, part[(cc * CRU_BM + r) * CRU_BN + tt]);
            v[h] = cru_rows_finish<T>(total, sizeof(T) == 1 && col < n_rows_w ? scale[col] : 1.0f);
        }
        if (EPI == 0) {
            const int col = cb * CRU_BN + t;
            if (col < N_out) {
                const long at = (long)m * N_out + col;
                y[at] = residual ? __fadd_rn(residual[at], v[0]) : v[0];
            }
        } else if (EPI == 1) {
            const int f = cb * 16 + t;
            if (f < N_out) y[(long)m * N_out + f] = cru_swiglu(v[0], v[1]);
        } else {
            const int h = cb >> 1, j = (cb & 1) * 16 + t;
            if (h >= n_heads + 2 * n_kv) continue;
            const int kv_dim = n_kv * 64;
            const long base = (((long)pages[m] * n_layers + layer) * 16 + slots[m]) * kv_dim;
            float* dst;
            float lo = v[0], hi = v[1];
            if (h < n_heads + n_kv) {
                const long at = (long)positions[m] * 32 + j;
                const float2 rr = cru_rope(v[0], v[1], cos_t[at], sin_t[at]);
                lo = rr.x;
                hi = rr.y;
                dst = h < n_heads ? y + (long)m * n_heads * 64 + h * 64
                                  : k_pool + base + (h - n_heads) * 64;
            } else {
                dst = v_pool + base + (h - n_heads - n_kv) * 64;
            }
            dst[j] = lo;
            dst[j + 32] = hi;
        }
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the forms the host launches, for `-Xptxas -v`.
#define CRU_BLOCK_INSTANTIATE(T, PRO, EPI)                                                     \
    template __global__ void linear_block<T, PRO, EPI>(                                        \
        const float*, const T*, const float*, const float*, float, const float*, float*, int, \
        int, int, const int*, const int*, const int*, const float*, const float*, float*,     \
        float*, int, int, int, int);
CRU_BLOCK_INSTANTIATE(signed char, 0, 0)
CRU_BLOCK_INSTANTIATE(signed char, 1, 1)
CRU_BLOCK_INSTANTIATE(signed char, 1, 2)
CRU_BLOCK_INSTANTIATE(float, 1, 2)
#endif
