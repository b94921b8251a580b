// mma_common.cuh: the pieces of the tensor-core GEMM order (stated in linear_mma.cu) that
// its kernels share: x's exact three-part bf16 split into mma A registers, int8 codes into
// B registers, the mma itself and a block's value from its three part accumulators.
// Fragment layout (PTX mma.m16n8k16, bf16): lane = 4 g + t; A registers (row g, slots 2t,
// 2t+1), (row g+8, 2t..), (row g, 2t+8, 2t+9), (row g+8, 2t+8..); B registers (slots 2t,
// 2t+1), (2t+8, 2t+9) of column g; C (row g, cols 2t, 2t+1), (row g+8, the same).
// No standard headers (NVRTC).
#pragma once
#include "gemm_common.cuh"

// Two bf16 values held as floats (low 16 bits zero) -> one register, the first in the low half.
__device__ __forceinline__ unsigned cru_bf16x2(float first, float second) {
    return __byte_perm(__float_as_uint(first), __float_as_uint(second), 0x7632);
}

// x = hi + mid + lo exactly: hi is x with its low 16 bits cleared, mid the same of x - hi
// (exact: at most 16 significant bits), lo the rest (exact, at most 8 bits: a bf16).
__device__ __forceinline__ void cru_split3(float x, float& hi, float& mid, float& lo) {
    hi = __uint_as_float(__float_as_uint(x) & 0xFFFF0000u);
    const float r = __fsub_rn(x, hi);
    mid = __uint_as_float(__float_as_uint(r) & 0xFFFF0000u);
    lo = __fsub_rn(r, mid);
}

// A registers of the three parts (a[0] hi, a[1] mid, a[2] lo) from a lane's four k of
// row g (v0) and row g + 8 (v1), in slot order.
__device__ __forceinline__ void cru_split_a(float4 v0, float4 v1, unsigned (&a)[3][4]) {
    const float r0[4] = {v0.x, v0.y, v0.z, v0.w}, r1[4] = {v1.x, v1.y, v1.z, v1.w};
    float p0[3][4], p1[3][4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        cru_split3(r0[e], p0[0][e], p0[1][e], p0[2][e]);
        cru_split3(r1[e], p1[0][e], p1[1][e], p1[2][e]);
    }
#pragma unroll
    for (int s = 0; s < 3; ++s) {
        a[s][0] = cru_bf16x2(p0[s][0], p0[s][1]);
        a[s][1] = cru_bf16x2(p1[s][0], p1[s][1]);
        a[s][2] = cru_bf16x2(p0[s][2], p0[s][3]);
        a[s][3] = cru_bf16x2(p1[s][2], p1[s][3]);
    }
}

// B registers from four int8 codes (k in slot order): each code is a bf16 exactly.
__device__ __forceinline__ void cru_codes_b(int q4, unsigned (&b)[2]) {
    float f[4];
    cru_unpack(q4, f);
    b[0] = cru_bf16x2(f[0], f[1]);
    b[1] = cru_bf16x2(f[2], f[3]);
}

__device__ __forceinline__ int cru_word(const int4& q, int j) {
    return j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w;
}

// c += A B over one 16 x 8 x 16 step (f32 accumulate).
__device__ __forceinline__ void cru_mma(float (&c)[4], const unsigned (&a)[4],
                                        const unsigned (&b)[2]) {
#ifdef CRU_HOST_SHIM  // tests/cuda_host/prelude.h: a stand-in sum, for the index arithmetic
    cru_host_mma(c, a, b);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// One block step j for the three parts (ONE_ACC: all into p[0], the checks' control).
template <bool ONE_ACC>
__device__ __forceinline__ void cru_mma3(float (&p)[3][4], const unsigned (&a)[3][4],
                                         const unsigned (&b)[2]) {
    cru_mma(p[0], a[0], b);
    cru_mma(p[ONE_ACC ? 0 : 1], a[1], b);
    cru_mma(p[ONE_ACC ? 0 : 2], a[2], b);
}

// total + the block's value (lo + mid) + hi, element e; the parts are then zeroed.
template <bool ONE_ACC>
__device__ __forceinline__ float cru_block_add(float total, float (&p)[3][4], int e) {
    const float b = ONE_ACC ? p[0][e] : __fadd_rn(__fadd_rn(p[2][e], p[1][e]), p[0][e]);
    p[0][e] = p[1][e] = p[2][e] = 0.0f;
    return __fadd_rn(total, b);
}

// Columns col, col + 1 of row: total * scale, then residual + that, last (float2 store).
__device__ __forceinline__ void cru_mma_store(float* y, const float* residual,
                                              const float* scale, int row, int col, int N,
                                              float t0, float t1) {
    float v0 = __fmul_rn(t0, scale[col]), v1 = __fmul_rn(t1, scale[col + 1]);
    const size_t at = (size_t)row * N + col;
    if (residual) {
        const float2 r = *reinterpret_cast<const float2*>(residual + at);
        v0 = __fadd_rn(r.x, v0);
        v1 = __fadd_rn(r.y, v1);
    }
    *reinterpret_cast<float2*>(y + at) = make_float2(v0, v1);
}
