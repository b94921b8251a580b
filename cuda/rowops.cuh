// rowops.cuh: the arithmetic of the row-wise stages, spelled once.
//
// Why this file exists: the same stage runs in two places. RMSNorm runs as its own kernel
// (rmsnorm_rows, model_ops.cu) for prefill and inside the decode GEMM's prologue
// (linear_rows, linear_rows.cu); SwiGLU and RoPE likewise run alone or in a GEMM epilogue.
// Bit identity between the two needs one spelling of every floating-point step, through
// explicit-rounding intrinsics that the compiler may not contract or reorder.
//
// RMSNorm's canonical tree (256 tree lanes in 8 warps, whatever the block size):
//   lane j: acc = fma(x[d], x[d], acc) for d = j, j + 256, ... ascending;
//   per warp: shuffle-down tree 16, 8, 4, 2, 1; then the 8 warp partials added ascending;
//   inv = 1 / sqrt(ss / D + eps) (each step rounded);  y = (x * inv) * w.
// No standard headers: NVRTC compiles this without a host toolchain.
#pragma once

// Canonical sums of squares of `rows` rows of length D (rows back to back at xs), all at
// once: virtual lane v = r*256 + j (row r, tree lane j) runs on flat thread v mod nthreads.
// The block size is a multiple of 32, so each virtual warp is one real warp's iteration and
// the shuffle tree is exactly rmsnorm's. part[r*8 + w] = warp w's partial of row r; the
// caller adds them with cru_rows_total after a __syncthreads (done here).
__device__ __forceinline__ void cru_rows_sumsq(const float* xs, int rows, int D, float* part) {
    const int nthreads = blockDim.x * blockDim.y;
    for (int v = threadIdx.y * blockDim.x + threadIdx.x; v < rows * 256; v += nthreads) {
        const float* row = xs + (v >> 8) * D;
        float acc = 0.0f;
        for (int d = v & 255; d < D; d += 256) acc = __fmaf_rn(row[d], row[d], acc);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, off));
        if ((v & 31) == 0) part[v >> 5] = acc;
    }
    __syncthreads();
}

// Row r's total: its 8 warp partials added in ascending order.
__device__ __forceinline__ float cru_rows_total(const float* part, int r) {
    float ss = part[r * 8];
    for (int i = 1; i < 8; ++i) ss = __fadd_rn(ss, part[r * 8 + i]);
    return ss;
}

__device__ __forceinline__ float cru_inv_rms(float ss, int D, float eps) {
    const float ms = __fdiv_rn(ss, (float)D);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
}

__device__ __forceinline__ float cru_norm_apply(float x, float inv, float w) {
    return __fmul_rn(__fmul_rn(x, inv), w);
}

// SwiGLU of one (gate, up) pair: silu(g) * u with silu(g) = g / (1 + exp(-g)).
__device__ __forceinline__ float cru_swiglu(float g, float u) {
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    return __fmul_rn(silu, u);
}

// Rotate-half RoPE of the pair (x1 = v[j], x2 = v[j + half]) by (c, s) = table[pos][j].
__device__ __forceinline__ float2 cru_rope(float x1, float x2, float c, float s) {
    return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)),
                       __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}
