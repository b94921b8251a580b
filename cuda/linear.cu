// linear.cu: batch-invariant GEMM  y[m, n] = sum_k x[m, k] * W[n, k]  (times scale[n] for int8)
//
// Layout: x f32 [M, K] row-major; weights stored transposed, wt [K, N] row-major (f32 or
// int8), so consecutive threads read consecutive n; scale f32 [N]; y f32 [M, N].
//
// Canonical order of every output element (the contract, whatever M or the kernel):
//   K is cut into chunks of CRU_KC = 64 at fixed offsets 0, 64, 128, ...;
//   partial_c = 0; for k ascending in chunk c: partial_c = fma(x[m,k], w[k,n], partial_c);
//   total = partial_0; total = total + partial_c for c = 1, 2, ... in ascending order;
//   int8: y = total * scale[n] (the int8 code is converted to float exactly);
//   with a residual: y = residual[m, n] + y (the transformer's skip connection, fused).
// All steps use explicit-rounding intrinsics, so nvcc cannot contract them differently in
// different kernels. linear_rows.cu (small M: decode, with fused norm/SwiGLU/RoPE stages)
// keeps the same order, so the host may pick either kernel by M without changing any result.
//
// linear_tiled<T> (large M: prefill, and the LM head from 36 rows): 64x64 output tile per
//   256-thread block, 4x4 per thread (tx = tid % 16 owns columns 4tx..4tx+3, ty = tid / 16
//   rows 4ty..4ty+3); one K chunk (64) of x and w staged in shared memory per iteration;
//   each thread forms the chunk partials of its 16 outputs from zero, then adds them to its
//   totals. Staging: thread t loads 16 consecutive k of x row (t % 64) (four float4) and 16
//   consecutive n of weight row k = t / 4 (one 16-byte int8 load, or four float4), the next
//   chunk's loads in flight while the current chunk is computed; spans that cross the
//   matrix edge or are misaligned (K % 4, N % 16) load element by element.
// No standard headers: NVRTC compiles this without a host toolchain.

#define CRU_KC 64

__device__ __forceinline__ float cru_w(const float* w, long i) { return w[i]; }
__device__ __forceinline__ float cru_w(const signed char* w, long i) { return (float)w[i]; }

template <typename T>
__device__ __forceinline__ float cru_finish(float total, const float* scale, int n);
template <>
__device__ __forceinline__ float cru_finish<float>(float total, const float*, int) { return total; }
template <>
__device__ __forceinline__ float cru_finish<signed char>(float total, const float* scale, int n) {
    return __fmul_rn(total, scale[n]);
}

// One thread's staging registers: 16 x values (one row, 16 consecutive k) and 16 weights
// (one k, 16 consecutive n) of a chunk.
template <typename T> struct TileStage {
    float4 x[4];
    float4 w[4];  // f32 weights
};
template <> struct TileStage<signed char> {
    float4 x[4];
    int4 w;  // 16 int8 codes
};

template <typename T>
__device__ __forceinline__ void cru_tile_load(TileStage<T>& st, const float* x, const T* wt,
                                              int M, int N, int K, int k0, int m, int kq,
                                              int kw, int n0, bool vec_x, bool vec_w) {
    // x: row m, k = k0 + 16 kq .. + 15
    const int kx = k0 + 16 * kq;
    float* xf = reinterpret_cast<float*>(st.x);
    if (m < M && vec_x && kx + 16 <= K) {
        const float4* p = reinterpret_cast<const float4*>(x + (long)m * K + kx);
#pragma unroll
        for (int i = 0; i < 4; ++i) st.x[i] = p[i];
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i)
            xf[i] = (m < M && kx + i < K) ? x[(long)m * K + kx + i] : 0.0f;
    }
    // w: k = k0 + kw, n = n0 .. n0 + 15
    const bool in_k = k0 + kw < K;
    const T* row = wt + (long)(k0 + kw) * N;
    if constexpr (sizeof(T) == 1) {
        if (in_k && vec_w && n0 + 16 <= N) {
            st.w = *reinterpret_cast<const int4*>(row + n0);
        } else {
            __align__(16) signed char b[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) b[i] = (in_k && n0 + i < N) ? row[n0 + i] : 0;
            st.w = *reinterpret_cast<const int4*>(b);
        }
    } else {
        float* wf = reinterpret_cast<float*>(st.w);
        if (in_k && vec_w && n0 + 16 <= N) {
#pragma unroll
            for (int i = 0; i < 4; ++i) st.w[i] = reinterpret_cast<const float4*>(row + n0)[i];
        } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) wf[i] = (in_k && n0 + i < N) ? row[n0 + i] : 0.0f;
        }
    }
}

template <typename T>
__device__ __forceinline__ void cru_tile_store(const TileStage<T>& st, float (*xs)[64 + 4],
                                               float (*ws)[64], int mm, int kq, int kw, int nq) {
    const float* xf = reinterpret_cast<const float*>(st.x);
#pragma unroll
    for (int i = 0; i < 16; ++i) xs[16 * kq + i][mm] = xf[i];
    float4* wdst = reinterpret_cast<float4*>(&ws[kw][16 * nq]);
    if constexpr (sizeof(T) == 1) {
        const int v[4] = {st.w.x, st.w.y, st.w.z, st.w.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // bytes 4q..4q+3 of the row, each converted exactly
            float f[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) f[i] = (float)(signed char)((v[q] >> (8 * i)) & 0xff);
            wdst[q] = make_float4(f[0], f[1], f[2], f[3]);
        }
    } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) wdst[q] = st.w[q];
    }
}

template <typename T>
__global__ void __launch_bounds__(256) linear_tiled(const float* __restrict__ x,
                                                    const T* __restrict__ wt,
                                                    const float* __restrict__ scale,
                                                    const float* __restrict__ residual,
                                                    float* __restrict__ y, int M, int N, int K) {
    __shared__ __align__(16) float xs[CRU_KC][64 + 4];  // [k][m], padded against bank conflicts
    __shared__ __align__(16) float ws[CRU_KC][64];      // [k][n]
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int m_base = blockIdx.y * 64, n_base = blockIdx.x * 64;
    // Staging roles: x row mm (16 k from quarter kq); weight row kw (16 n from quarter nq).
    const int mm = threadIdx.x & 63, kq = threadIdx.x >> 6;
    const int kw = threadIdx.x >> 2, nq = threadIdx.x & 3;
    const bool vec_x = (K & 3) == 0;                        // rows of x start 16-byte aligned
    const bool vec_w = (N & (sizeof(T) == 1 ? 15 : 3)) == 0;  // rows of wt likewise
    float total[4][4], part[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) total[i][j] = 0.0f;
    TileStage<T> st;
    cru_tile_load<T>(st, x, wt, M, N, K, 0, m_base + mm, kq, kw, n_base + 16 * nq, vec_x, vec_w);
    for (int k0 = 0; k0 < K; k0 += CRU_KC) {
        const int kn = min(CRU_KC, K - k0);
        cru_tile_store<T>(st, xs, ws, mm, kq, kw, nq);
        __syncthreads();
        if (k0 + CRU_KC < K)  // the next chunk's loads are in flight while this one computes
            cru_tile_load<T>(st, x, wt, M, N, K, k0 + CRU_KC, m_base + mm, kq, kw,
                             n_base + 16 * nq, vec_x, vec_w);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) part[i][j] = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < kn; ++kk) {  // exact chunk length: no padded fma steps
            const float4 a4 = *reinterpret_cast<const float4*>(&xs[kk][ty * 4]);
            const float4 b4 = *reinterpret_cast<const float4*>(&ws[kk][tx * 4]);
            const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) part[i][j] = __fmaf_rn(a[i], b[j], part[i][j]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                total[i][j] = (k0 == 0) ? part[i][j] : __fadd_rn(total[i][j], part[i][j]);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int m = m_base + ty * 4 + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int n = n_base + tx * 4 + j;
            if (n >= N) continue;
            float v = cru_finish<T>(total[i][j], scale, n);
            long at = (long)m * N + n;
            y[at] = residual ? __fadd_rn(residual[at], v) : v;
        }
    }
}

#ifndef __CUDACC_RTC__
template __global__ void linear_tiled<float>(const float*, const float*, const float*,
                                             const float*, float*, int, int, int);
template __global__ void linear_tiled<signed char>(const float*, const signed char*,
                                                   const float*, const float*, float*, int,
                                                   int, int);
#endif
