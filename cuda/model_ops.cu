// model_ops.cu: the elementwise and per-row kernels of the Llama forward.
//
// Layout: packed activations are f32 [T, width] row-major; the KV pool is
// pool[page][layer][16][kv_dim] f32; rope tables are f32 [max_pos, head_dim/2].
// Every kernel computes each output from its own row only, in a fixed order, so a row's
// bits never depend on the other rows of the step.
//
// embed_rows:   grid (T), block 256: y[t, :] = table[ids[t], :].
// embed_fed:    as embed_rows, but a row with feed[t] >= 0 takes its id from fed[feed[t]]:
//   the previous step's sampled ids, still on the device (pipelined decode; the host
//   launches step t+1 before it has read step t's ids).
// rmsnorm_rows: grid (T), block 256 (8 warps): thread j squares-and-adds x[j], x[j+256], ...
//   with fma; shuffle-down tree 16,8,4,2,1 per warp; warp 0 lane 0 adds the 8 warp partials
//   in ascending order; inv = 1 / sqrt(ss / D + eps); y = (x * inv) * w.
// rope_store:   grid (T), block 128: rotate-half RoPE (x1*c - x2*s, x2*c + x1*s) of every Q
//   head into q_out [T, H*hd] (contiguous, for attention) and of every K head straight into
//   the K pool at (pages[t], slots[t]) of `layer`; V is copied to the V pool.
// swiglu_rows:  y[t, f] = g / (1 + exp(-g)) * u with g = gu[t, f], u = gu[t, F + f].
// gather_rows:  y[r, :] = x[rows[r], :]. (Residual adds are fused into linear.cu's epilogue.)
// The arithmetic of RMSNorm, RoPE and SwiGLU is spelled once in rowops.cuh, shared with the
// fused decode GEMM (linear_rows.cu), so both paths give the same bits.
// PDL (pdl.cuh): every kernel here reads only what earlier kernels of the step wrote, so each
// waits first; with the tensor-core GEMMs (linear_mma*.cu) these are the kernels between
// them, and a chain of PDL launches gains only where every link takes part.
#include "pdl.cuh"
#include "rowops.cuh"

__global__ void embed_rows(const float* __restrict__ table, const int* __restrict__ ids,
                           float* __restrict__ y, int D) {
    cru_pdl_wait();
    cru_pdl_trigger();
    const long t = blockIdx.x;
    const float* src = table + (long)ids[t] * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) y[t * D + d] = src[d];
}

__global__ void embed_fed(const float* __restrict__ table, const int* __restrict__ ids,
                          const int* __restrict__ feed, const int* __restrict__ fed,
                          float* __restrict__ y, int D) {
    cru_pdl_wait();
    cru_pdl_trigger();
    const long t = blockIdx.x;
    const int f = feed[t];
    const float* src = table + (long)(f >= 0 ? fed[f] : ids[t]) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) y[t * D + d] = src[d];
}

__global__ void __launch_bounds__(256) rmsnorm_rows(const float* __restrict__ x,
                                                    const float* __restrict__ w,
                                                    float* __restrict__ y, int D, float eps) {
    cru_pdl_wait();
    cru_pdl_trigger();
    __shared__ float warp_part[8];
    __shared__ float inv_shared;
    const float* row = x + (long)blockIdx.x * D;
    cru_rows_sumsq(row, 1, D, warp_part);
    if (threadIdx.x == 0) inv_shared = cru_inv_rms(cru_rows_total(warp_part, 0), D, eps);
    __syncthreads();
    const float inv = inv_shared;
    float* out = y + (long)blockIdx.x * D;
    for (int d = threadIdx.x; d < D; d += 256) out[d] = cru_norm_apply(row[d], inv, w[d]);
}

__global__ void rope_store(const float* __restrict__ qkv, float* __restrict__ q_out,
                           const int* __restrict__ positions, const int* __restrict__ pages,
                           const int* __restrict__ slots, const float* __restrict__ cos_t,
                           const float* __restrict__ sin_t, float* __restrict__ k_pool,
                           float* __restrict__ v_pool, int layer, int n_layers, int n_heads,
                           int n_kv, int hd) {
    cru_pdl_wait();
    cru_pdl_trigger();
    const long t = blockIdx.x;
    const int half = hd / 2;
    const int q_dim = n_heads * hd, kv_dim = n_kv * hd;
    const float* row = qkv + t * (q_dim + 2 * kv_dim);
    const float* c = cos_t + (long)positions[t] * half;
    const float* s = sin_t + (long)positions[t] * half;
    const long base = (((long)pages[t] * n_layers + layer) * 16 + slots[t]) * kv_dim;
    for (int i = threadIdx.x; i < (n_heads + n_kv) * half; i += blockDim.x) {
        int head = i / half, j = i % half;
        const float* v = row + head * hd;  // K heads follow Q heads in qkv
        float x1 = v[j], x2 = v[j + half];
        const float2 r = cru_rope(x1, x2, c[j], s[j]);
        float* dst = head < n_heads ? q_out + t * q_dim + head * hd
                                    : k_pool + base + (head - n_heads) * hd;
        dst[j] = r.x;
        dst[j + half] = r.y;
    }
    for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) v_pool[base + d] = row[q_dim + kv_dim + d];
}

__global__ void swiglu_rows(const float* __restrict__ gu, float* __restrict__ y, int F, long n) {
    cru_pdl_wait();
    cru_pdl_trigger();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long t = i / F;
    int f = (int)(i % F);
    float g = gu[t * 2 * F + f], u = gu[t * 2 * F + F + f];
    y[i] = cru_swiglu(g, u);
}

__global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ rows,
                            float* __restrict__ y, int D) {
    cru_pdl_wait();
    cru_pdl_trigger();
    const long r = blockIdx.x;
    const float* src = x + (long)rows[r] * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) y[r * D + d] = src[d];
}
