// rows_chunk.cuh: the pieces of the decode GEMMs that more than one kernel runs: one
// column's 64-wide K chunk as loaded (RawChunk), the epilogue inputs, weight slices staged
// in shared memory and their chunk chains, and the staging of x combined with a previous
// GEMM's chunk partials.
//
// Users: linear_rows.cu (the row kernels), decode_mlp.cu (the batch-1 MLP), and
// attention_decode.cu (the O projection's partials of the batch-1 decode stack). The order of
// every output element is linear.cu's canonical one: partial_c is a sequential fma chain
// over chunk c from 0 (k ascending), the partials add in ascending c, int8 multiplies that
// total by the column's scale, and a residual is added last. No standard headers (NVRTC).
#pragma once
#include "gemm_common.cuh"

// The kernel's dynamic shared memory (the host shim maps it onto a buffer of its own).
#ifndef CRU_DYNAMIC_SMEM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

// One column's 64-wide K chunk, as loaded. int8 chunks (64 B) are loaded whole into
// registers at the very start of the kernel, so the loads overlap the staging and the
// RMSNorm of x; f32 chunks (256 B) are loaded a quarter (16 values) at a time when used.
template <typename T> struct RawChunk;
template <> struct RawChunk<signed char> {
    int4 v[4];
    __device__ __forceinline__ void load(const signed char* p) {
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = reinterpret_cast<const int4*>(p)[q];
    }
    __device__ __forceinline__ void quarter(int q, const signed char*, float* f) const {
        cru_unpack(v[q].x, f); cru_unpack(v[q].y, f + 4);
        cru_unpack(v[q].z, f + 8); cru_unpack(v[q].w, f + 12);
    }
};
template <> struct RawChunk<float> {
    __device__ __forceinline__ void load(const float*) {}
    __device__ __forceinline__ void quarter(int q, const float* p, float* f) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float4 v = reinterpret_cast<const float4*>(p + 16 * q)[i];
            f[4 * i] = v.x; f[4 * i + 1] = v.y; f[4 * i + 2] = v.z; f[4 * i + 3] = v.w;
        }
    }
};
__device__ __forceinline__ float cru_w1(const float* p, int i) { return p[i]; }
__device__ __forceinline__ float cru_w1(const signed char* p, int i) { return (float)p[i]; }

// Column j of this lane's NC columns in column block cb (see the epilogue table above).
template <int EPI>
__device__ __forceinline__ int cru_rows_col(int cb, int j, int lane, int F) {
    if (EPI == 2) return cb * 64 + lane + 32 * j;
    if (EPI == 1) return cb * 32 + lane + F * j;
    return cb * 32 + lane;
}

// What the epilogue of one (row, column block) reads besides the partials: the int8
// scales, the residual, RoPE's cos/sin and the pool offset. Loaded at the start of the
// kernel for the first column block, so none of these loads sits on the critical path.
template <int NC>
struct EpiIn {
    float sc[NC];
    float res, cs, sn;
    long base;
};

// Everything but the residual: none of it is written by a kernel of the step, so the first
// column block's copy loads before cru_pdl_wait (pdl.cuh).
template <typename T, int NC, int EPI>
__device__ __forceinline__ EpiIn<NC> cru_epi_load(int cb, int m, int lane, int N_out,
                                                  int n_rows_w, const float* scale,
                                                  const int* positions,
                                                  const int* pages, const int* slots,
                                                  const float* cos_t, const float* sin_t,
                                                  int n_layers, int layer, int kv_dim) {
    EpiIn<NC> e;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int col = cru_rows_col<EPI>(cb, j, lane, N_out);
        e.sc[j] = (sizeof(T) == 1 && col < n_rows_w) ? scale[col] : 1.0f;
    }
    e.res = 0.0f;
    e.cs = e.sn = 0.0f;
    e.base = 0;
    if (EPI == 2) {
        const long t = (long)positions[m] * 32 + lane;
        e.cs = cos_t[t];
        e.sn = sin_t[t];
        e.base = (((long)pages[m] * n_layers + layer) * 16 + slots[m]) * kv_dim;
    }
    return e;
}

// The residual of (row m, column block cb): written by the step's previous kernels, so it
// loads after cru_pdl_wait.
template <int EPI>
__device__ __forceinline__ float cru_epi_res(int cb, int m, int lane, int N_out,
                                             const float* residual) {
    if (EPI == 0 && residual != nullptr && cb * 32 + lane < N_out)
        return residual[(long)m * N_out + cb * 32 + lane];
    return 0.0f;
}

template <typename T, int MT, int NC, int EPI>
__device__ __forceinline__ void cru_rows_chunk(const RawChunk<T>* raw, bool preloaded,
                                               const T* __restrict__ w, const float* xs,
                                               float* part, int cb, int c, int lane, int K,
                                               int N_out, int n_rows_w) {
    const int k0 = c * CRU_KC, kn = min(CRU_KC, K - k0);
    const bool vec = kn == CRU_KC && (K & 15) == 0;  // 16-byte loads need K % 16 == 0
#pragma unroll
    for (int j = 0; j < NC; ++j) {
        const int col = cru_rows_col<EPI>(cb, j, lane, N_out);
        float acc[MT];
#pragma unroll
        for (int r = 0; r < MT; ++r) acc[r] = 0.0f;
        if (col < n_rows_w) {
            const T* wp = w + (long)col * K + k0;
            if (vec) {
                RawChunk<T> rc = raw[j];
                if (!preloaded) rc.load(wp);
#pragma unroll
                for (int q = 0; q < CRU_KC / 16; ++q) {
                    float f[16];
                    rc.quarter(q, wp, f);
                    // x as float4: one shared load per 4 fmas; each row's chain stays in
                    // ascending k.
#pragma unroll
                    for (int r = 0; r < MT; ++r) {
                        const float4* x4 = reinterpret_cast<const float4*>(xs + r * K + k0 + 16 * q);
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const float4 xv = x4[i];
                            acc[r] = __fmaf_rn(xv.x, f[4 * i], acc[r]);
                            acc[r] = __fmaf_rn(xv.y, f[4 * i + 1], acc[r]);
                            acc[r] = __fmaf_rn(xv.z, f[4 * i + 2], acc[r]);
                            acc[r] = __fmaf_rn(xv.w, f[4 * i + 3], acc[r]);
                        }
                    }
                }
            } else {
                for (int kk = 0; kk < kn; ++kk) {
                    const float wk = cru_w1(wp, kk);
#pragma unroll
                    for (int r = 0; r < MT; ++r) acc[r] = __fmaf_rn(xs[r * K + k0 + kk], wk, acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MT; ++r) part[((c * MT + r) * NC + j) * 32 + lane] = acc[r];
    }
}

// 16 bytes global -> shared without registers (Ampere+ cp.async; the L1 is bypassed), and
// the wait for every copy this thread issued. The copies are in flight across the PDL wait.
// (CRU_HOST_SHIM: tests/cuda_host/prelude.h runs these sources on the CPU, with a plain
// copy here and no pins below.)
#ifndef CRU_HOST_SHIM
__device__ __forceinline__ void cru_cp16(void* dst, const void* src) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
}
__device__ __forceinline__ void cru_cp_wait_all() {
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_all;" ::: "memory");
}
#define CRU_PIN(v) asm volatile("" : "+f"(v))
#else
__device__ __forceinline__ void cru_cp16(void* dst, const void* src) { __builtin_memcpy(dst, src, 16); }
__device__ __forceinline__ void cru_cp_wait_all() {}
#define CRU_PIN(v) ((void)0)
#endif

// A weight slice in shared memory: one 64-wide K chunk (columns k0 .. k0 + 63) of n_cols
// columns of W [N, K], piece-major: 16-byte piece p of column n at int4 slot p * n_cols + n.
// Why piece-major: thread t computes column t, so a warp reads 32 consecutive slots per
// piece (no bank conflicts); column-major 64-byte rows put four threads of every 8 on the
// same banks (4-way conflicts: ~0.6 µs on a 36 KB slice). The copy walks pieces fastest, so
// four consecutive threads read one column's 64 contiguous bytes from global memory.
template <typename T>
__device__ __forceinline__ void cru_stage_slice(int4* dst, const T* w, long K, int k0,
                                                int n_cols, int tid, int nthreads) {
    constexpr int P = 4 * (int)sizeof(T);  // pieces of one column's 64 weights
    for (int i = tid; i < n_cols * P; i += nthreads) {
        const int n = i / P, p = i % P;
        cru_cp16(dst + p * n_cols + n,
                 reinterpret_cast<const char*>(w + n * K + k0) + 16 * p);
    }
}

// A piece's weights as floats: 16 int8 codes or 4 f32.
__device__ __forceinline__ void cru_piece(const int4& v, float* f, signed char) {
    cru_unpack(v.x, f); cru_unpack(v.y, f + 4); cru_unpack(v.z, f + 8); cru_unpack(v.w, f + 12);
}
__device__ __forceinline__ void cru_piece(const int4& v, float* f, float) {
    f[0] = __int_as_float(v.x); f[1] = __int_as_float(v.y);
    f[2] = __int_as_float(v.z); f[3] = __int_as_float(v.w);
}

// The chunk chains of NCOL columns of a staged slice, side by side (independent chains, so
// their fma latencies overlap): acc[j] = fma(x[k], w[cols[j], k0 + k], acc[j]) for k = 0..63
// ascending, from 0: cru_rows_chunk's order. x: 64 floats, 16-byte aligned (shared memory).
template <typename T, int NCOL>
__device__ __forceinline__ void cru_slice_chains(const int4* slice, int n_cols,
                                                 const int (&cols)[NCOL], const float* x,
                                                 float (&acc)[NCOL]) {
    constexpr int W = 16 / (int)sizeof(T);  // weights per piece
#pragma unroll
    for (int j = 0; j < NCOL; ++j) acc[j] = 0.0f;
#pragma unroll
    for (int p = 0; p < CRU_KC / W; ++p) {
        const float4* x4 = reinterpret_cast<const float4*>(x + p * W);
#pragma unroll
        for (int j = 0; j < NCOL; ++j) {
            float f[W];
            cru_piece(slice[p * n_cols + cols[j]], f, T());
#pragma unroll
            for (int i = 0; i < W / 4; ++i) {
                const float4 xv = x4[i];
                acc[j] = __fmaf_rn(xv.x, f[4 * i], acc[j]);
                acc[j] = __fmaf_rn(xv.y, f[4 * i + 1], acc[j]);
                acc[j] = __fmaf_rn(xv.z, f[4 * i + 2], acc[j]);
                acc[j] = __fmaf_rn(xv.w, f[4 * i + 3], acc[j]);
            }
        }
    }
}

#define CRU_MAX_PARTS 24  // chunk partials a combine adds: K <= 1536 of the GEMM that made them

// Elements k0 + i * kstep (i < NE, those below K) of row m as the next GEMM stages them.
// Without partials: x itself. With them (the batch-1 decode stack, where the previous GEMM
// left one partial per K chunk instead of its output): x + total * scale, total = p_0 +
// p_1 + ... ascending, which is exactly the epilogue that GEMM would have run with x as its
// residual. parts: [n_parts][M][K]; scale: [K] for int8 weights, nullptr for f32.
// Every load (NE elements' partials, x and the scale) is issued before the first add: left
// to itself the compiler sank each load next to its add, one L2 round trip per partial
// (+6.8 µs for 24 partials on the H200). So the loads are unconditional (past n_parts they
// re-read the last partial, past K element 0: cached lines) and an empty asm pins each
// value before any add.
template <typename T, int NE>
__device__ __forceinline__ void cru_combined(const float* x, const float* parts, int n_parts,
                                             const float* scale, int M, int m, int K, int k0,
                                             int kstep, float (&out)[NE]) {
    const long stride = (long)M * K;
    float base[NE], sc[NE], p[NE][CRU_MAX_PARTS];
#pragma unroll
    for (int i = 0; i < NE; ++i) {
        const int k = k0 + i * kstep < K ? k0 + i * kstep : 0;
        base[i] = x[(long)m * K + k];
        if (n_parts == 0) continue;
        sc[i] = scale != nullptr ? scale[k] : 1.0f;
#pragma unroll
        for (int c = 0; c < CRU_MAX_PARTS; ++c)
            p[i][c] = parts[min(c, n_parts - 1) * stride + (long)m * K + k];
    }
#pragma unroll
    for (int i = 0; i < NE; ++i) {
        out[i] = base[i];
        if (n_parts == 0) continue;
#pragma unroll
        for (int c = 0; c < CRU_MAX_PARTS; ++c) CRU_PIN(p[i][c]);
        float total = p[i][0];
#pragma unroll
        for (int c = 1; c < CRU_MAX_PARTS; ++c)
            if (c < n_parts) total = __fadd_rn(total, p[i][c]);
        out[i] = __fadd_rn(base[i], cru_rows_finish<T>(total, sc[i]));
    }
}
