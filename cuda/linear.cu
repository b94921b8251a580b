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
// linear_tiled<T> (large M, prefill): 64x64 output tile per 256-thread block, 4x4 per
//   thread; one K chunk (64) of x and w staged in shared memory per iteration; each thread
//   forms the chunk partials of its 16 outputs from zero, then adds them to its totals.
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

template <typename T>
__global__ void __launch_bounds__(256) linear_tiled(const float* __restrict__ x,
                                                    const T* __restrict__ wt,
                                                    const float* __restrict__ scale,
                                                    const float* __restrict__ residual,
                                                    float* __restrict__ y, int M, int N, int K) {
    __shared__ float xs[CRU_KC][64 + 4];  // [k][m], padded against bank conflicts
    __shared__ float ws[CRU_KC][64];      // [k][n]
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int m_base = blockIdx.y * 64, n_base = blockIdx.x * 64;
    float total[4][4], part[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) total[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += CRU_KC) {
        const int kn = min(CRU_KC, K - k0);
        for (int i = threadIdx.x; i < 64 * CRU_KC; i += 256) {
            int mm = i / CRU_KC, kk = i % CRU_KC;  // coalesced along k
            int m = m_base + mm;
            xs[kk][mm] = (m < M && kk < kn) ? x[(long)m * K + k0 + kk] : 0.0f;
            int kk2 = i / 64, nn = i % 64;  // coalesced along n
            int n = n_base + nn;
            ws[kk2][nn] = (n < N && kk2 < kn) ? cru_w(wt, (long)(k0 + kk2) * N + n) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) part[i][j] = 0.0f;
        for (int kk = 0; kk < kn; ++kk) {  // exact chunk length: no padded fma steps
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
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
