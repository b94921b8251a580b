// linear_wide.cu: the large-M GEMM y[m, n] = sum_k x[m, k] * W[n, k] (times scale[n] for
// int8, plus residual[m, n] last), bit for bit linear_tiled's (cuda/linear.cu), faster.
//
// Layout: x f32 [M, K] row-major; wt [K, N] row-major (W transposed, as DeviceWeight.wt:
// the tiled kernel's copy), f32 or int8 codes; scale f32 [N]; y, residual f32 [M, N]. The
// host (linear_wide.py) passes 16-byte aligned pointers only.
//
// Canonical order (linear.cu), kept per output: K cut into 64-wide chunks at 0, 64, ...;
// partial_c = fma chain from 0.0f over chunk c's k ascending (exactly its length, so a tail
// chunk has no padded steps); total = partial_0, then total + partial_c for c ascending;
// int8: total * scale[n]; residual[m, n] + that, last. Explicit-rounding intrinsics only.
//
// Why faster than linear_tiled: an 8x4 register tile (32 chains per thread, 12 float4
// shared reads per 128 fma against its 4x4 tile's 8 per 64), cp.async double-buffered
// staging, and G "K groups" per CTA for narrow N: group g computes chunk r*G + g of round r,
// so a tile gets G times the threads (the o and down GEMMs, N = 576, have too few output
// tiles to fill 132 SMs with one chain set per output). A round's G partials meet in shared
// memory and are added in ascending chunk order, so the split changes no bits.
// Template: T (float / signed char), BM x BN tile, G K groups (1..8), WK k per stage (16/32).
//
// Thread mapping: BM x BN output tile, NT = G * P threads, P = (BM/8) * (BN/4) per group;
// g = t / P, p = t % P, tn = p % (BN/4), tm = p / (BN/4). Thread (g, p) forms partials of
// rows tm + (BM/8) i (i < 8: interleaved, so a warp's x reads hit distinct banks) and
// columns 4 tn .. 4 tn + 3 (one float4 of w per k). Totals: thread (g, p) keeps rows
// i = g, g + G, ... (< 8) of thread p's tile and writes them (float4 y stores); G = 1 keeps
// its totals in its own shared slots (no barrier), saving 32 registers.
//
// Staging, per stage of WK k (a quarter or half chunk): xs[BM][G WK + 4] holds x[m][WK k of
// each group's chunk] (row stride G WK + 4 floats: odd in float4 units, conflict-free
// float4 reads along k); ws[G WK][BN] the same k of w, int8 unpacked exactly (cru_unpack).
// x and f32 w go global -> shared by cp.async (zero-filled past M, N, K); int8 w through
// registers (one 16-byte load, unpacked when stored). Two stage buffers: the next stage
// copies while this one computes. Misaligned rows (K % 4 for x; N % 4 f32 or N % 16 int8
// for w) load element by element instead. Shared memory (dynamic, float):
//   2 * (BM * (G WK + 4) + G WK * BN) stage buffers + G * BM * BN: the round's partials
//   (float4 pb[G][8][P]: group g's row i of thread p at pb[g][i][p]), or G = 1's totals.
// Barriers per stage: one (the stage is visible; everyone left the buffer the next stage
// overwrites). Per round with G > 1: one more between writing and adding the partials
// (the next round's writes come after its first stage's barrier).
// No standard headers (NVRTC).
#include "gemm_common.cuh"

#ifndef CRU_DYNAMIC_SMEM
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif

#ifndef CRU_HOST_SHIM
// 16 bytes global -> shared (cp.async, L1 bypassed); bytes = 0 writes 16 zero bytes.
__device__ __forceinline__ void cru_wide_cp16(void* dst, const void* src, int bytes) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(at), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cru_wide_wait() {
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_all;" ::: "memory");
}
#else
__device__ __forceinline__ void cru_wide_cp16(void* dst, const void* src, int bytes) {
    if (bytes) __builtin_memcpy(dst, src, 16); else __builtin_memset(dst, 0, 16);
}
__device__ __forceinline__ void cru_wide_wait() {}
#endif

__device__ __forceinline__ float cru_c4(const float4& v, int e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
__device__ __forceinline__ int cru_i4(const int4& v, int e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

template <typename T, int BM, int BN, int G, int WK>
__global__ void __launch_bounds__(G * BM * BN / 32)
linear_wide(const float* __restrict__ x, const T* __restrict__ wt,
            const float* __restrict__ scale, const float* __restrict__ residual,
            float* __restrict__ y, int M, int N, int K) {
    constexpr int RB = BM / 8, CB = BN / 4, P = RB * CB, NT = G * P;
    constexpr int SPC = CRU_KC / WK;                 // stages per chunk
    constexpr int SW = G * WK, LDX = SW + 4;         // staged k columns; x row stride
    constexpr int XS = BM * LDX, WS = SW * BN;       // floats per stage buffer
    constexpr int XV = BM * SW / 4 / NT;             // x float4 blocks per thread (8 WK / BN)
    constexpr int WB = sizeof(T) == 1 ? SW * BN / 16 : SW * BN / 4;  // w 16-byte blocks
    constexpr int WV = (WB + NT - 1) / NT;           // ... per thread
    constexpr int OR = (8 + G - 1) / G;              // rows of totals per thread (i = g + G ii)
    static_assert(BM % 32 == 0 && BM <= 128 && BN % 32 == 0 && BN <= 128, "tile shape");
    static_assert(G >= 1 && G <= 8 && (WK == 16 || WK == 32), "K groups, stage width");
    static_assert(P % 32 == 0 && NT <= 1024 && XV * NT * 4 == BM * SW, "whole warps, blocks");

    CRU_DYNAMIC_SMEM(float4, wide_smem4);
    float* const smem = reinterpret_cast<float*>(wide_smem4);
    float4* const pb = wide_smem4 + (2 * XS + 2 * WS) / 4;  // round partials (G > 1)

    const int tid = threadIdx.x, g = tid / P, p = tid % P, tn = p % CB, tm = p / CB;
    const int m_base = blockIdx.y * BM, n_base = blockIdx.x * BN;
    const int chunks = (K + CRU_KC - 1) / CRU_KC, rounds = (chunks + G - 1) / G;
    const int last_k = K - (rounds - 1) * G * CRU_KC;  // k in the last round's first chunk
    const int stages = (rounds - 1) * SPC + min(SPC, (last_k + WK - 1) / WK);
    const bool vec_x = (K & 3) == 0;                                // x rows 16-byte aligned
    const bool vec_w = (N & (sizeof(T) == 1 ? 15 : 3)) == 0;        // wt rows likewise
    const bool vec_y = (N & 3) == 0;                                // y / residual rows

    // Stage s: round s / SPC, part s % SPC of its chunks; group h's first k of the stage.
    auto k_of = [&](int s, int h) { return ((s / SPC) * G + h) * CRU_KC + (s % SPC) * WK; };
    // int8 w: block b = t + NT v (b < WB) is weight row b / (BN/16), 16 columns from 16 q.
    int4 wreg[WV];

    auto issue = [&](int s, int buf) {  // stage s -> buffer buf
        float* xs = smem + buf * XS;
#pragma unroll
        for (int v = 0; v < XV; ++v) {
            const int b = tid + NT * v, row = b / (SW / 4), q = b % (SW / 4);
            const int k = k_of(s, q / (WK / 4)) + 4 * (q % (WK / 4)), m = m_base + row;
            float* dst = xs + row * LDX + 4 * q;
            const float* src = x + (long)m * K + k;
            if (vec_x) {
                const bool ok = m < M && k < K;
                cru_wide_cp16(dst, ok ? src : x, ok ? 16 : 0);
            } else {
                float f[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) f[e] = (m < M && k + e < K) ? src[e] : 0.0f;
                *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
            }
        }
        if constexpr (sizeof(T) == 1) {
#pragma unroll
            for (int v = 0; v < WV; ++v) {
                const int b = tid + NT * v, kr = b / (BN / 16), q = b % (BN / 16);
                const int k = k_of(s, kr / WK) + kr % WK, n = n_base + 16 * q;
                const T* src = wt + (long)k * N + n;
                if (b >= WB) {  // no block for this thread
                } else if (vec_w) {
                    wreg[v] = (k < K && n < N) ? *reinterpret_cast<const int4*>(src)
                                               : make_int4(0, 0, 0, 0);
                } else {
                    int c[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int e = 0; e < 16; ++e)
                        if (k < K && n + e < N)
                            c[e / 4] |= (int)(unsigned char)src[e] << (8 * (e % 4));
                    wreg[v] = make_int4(c[0], c[1], c[2], c[3]);
                }
            }
        } else {
            float* ws = smem + 2 * XS + buf * WS;
#pragma unroll
            for (int v = 0; v < WV; ++v) {
                const int b = tid + NT * v, kr = b / (BN / 4), q = b % (BN / 4);
                const int k = k_of(s, kr / WK) + kr % WK, n = n_base + 4 * q;
                float* dst = ws + kr * BN + 4 * q;
                const T* src = wt + (long)k * N + n;
                if (vec_w) {
                    const bool ok = k < K && n < N;
                    cru_wide_cp16(dst, ok ? (const void*)src : (const void*)wt, ok ? 16 : 0);
                } else {
                    float f[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) f[e] = (k < K && n + e < N) ? src[e] : 0.0f;
                    *reinterpret_cast<float4*>(dst) = make_float4(f[0], f[1], f[2], f[3]);
                }
            }
        }
    };

    // G > 1: this thread's rows of totals in registers; G = 1: in pb (32 registers saved).
    constexpr int TR = G == 1 ? 1 : OR;
    float part[8][4], tot[TR][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[i][j] = 0.0f;
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) tot[i][j] = 0.0f;

    issue(0, 0);
    for (int s = 0; s < stages; ++s) {
        const int buf = s & 1;
        const float* xs = smem + buf * XS;
        float* ws = smem + 2 * XS + buf * WS;
        if constexpr (sizeof(T) == 1) {
            // 16 codes -> 16 exact floats; the four float4 rotate by q so that neighbouring
            // blocks' stores spread over the banks.
#pragma unroll
            for (int v = 0; v < WV; ++v) {
                const int b = tid + NT * v, kr = b / (BN / 16), q = b % (BN / 16);
                if (b < WB)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int c = (e + q) & 3;
                        float f[4];
                        cru_unpack(cru_i4(wreg[v], c), f);
                        *reinterpret_cast<float4*>(ws + kr * BN + 16 * q + 4 * c) =
                            make_float4(f[0], f[1], f[2], f[3]);
                    }
            }
        }
        cru_wide_wait();
        __syncthreads();  // stage s visible; every thread has left buffer buf ^ 1
        if (s + 1 < stages) issue(s + 1, buf ^ 1);

        const int kc = min(WK, K - k_of(s, g));  // this group's k in the stage
        const float* xa = xs + tm * LDX + WK * g;
        const float* wb = ws + WK * g * BN + 4 * tn;
        if (kc == WK) {
#pragma unroll
            for (int q = 0; q < WK / 4; ++q) {
                float4 a[8];
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    a[i] = *reinterpret_cast<const float4*>(xa + i * RB * LDX + 4 * q);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const float4 b = *reinterpret_cast<const float4*>(wb + (4 * q + u) * BN);
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        const float ai = cru_c4(a[i], u);
                        part[i][0] = __fmaf_rn(ai, b.x, part[i][0]);
                        part[i][1] = __fmaf_rn(ai, b.y, part[i][1]);
                        part[i][2] = __fmaf_rn(ai, b.z, part[i][2]);
                        part[i][3] = __fmaf_rn(ai, b.w, part[i][3]);
                    }
                }
            }
        } else {
            for (int kk = 0; kk < kc; ++kk) {  // a tail chunk: exactly its k, no padding
                const float4 b = *reinterpret_cast<const float4*>(wb + kk * BN);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float ai = xa[i * RB * LDX + kk];
                    part[i][0] = __fmaf_rn(ai, b.x, part[i][0]);
                    part[i][1] = __fmaf_rn(ai, b.y, part[i][1]);
                    part[i][2] = __fmaf_rn(ai, b.z, part[i][2]);
                    part[i][3] = __fmaf_rn(ai, b.w, part[i][3]);
                }
            }
        }

        if (s % SPC == SPC - 1 || s == stages - 1) {  // end of round: fold it in order
            const int c0 = (s / SPC) * G;                // chunk of group 0 in this round
            if constexpr (G == 1) {  // totals in this thread's own shared slots: no barrier
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    float4 t = make_float4(part[i][0], part[i][1], part[i][2], part[i][3]);
                    if (c0 > 0) {
                        const float4 o = pb[i * P + p];
                        t = make_float4(__fadd_rn(o.x, t.x), __fadd_rn(o.y, t.y),
                                        __fadd_rn(o.z, t.z), __fadd_rn(o.w, t.w));
                    }
                    pb[i * P + p] = t;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    pb[(g * 8 + i) * P + p] =
                        make_float4(part[i][0], part[i][1], part[i][2], part[i][3]);
                __syncthreads();
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    if (c0 + h >= chunks) break;
#pragma unroll
                    for (int ii = 0; ii < OR; ++ii) {
                        if (g + G * ii >= 8) break;
                        const float4 v = pb[(h * 8 + g + G * ii) * P + p];
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            tot[ii][j] = c0 + h == 0 ? cru_c4(v, j)
                                                     : __fadd_rn(tot[ii][j], cru_c4(v, j));
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) part[i][j] = 0.0f;
        }
    }

    // Epilogue: int8 scale, then the residual, last (linear.cu's cru_finish order).
    const int n0 = n_base + 4 * tn;
    if (n0 >= N) return;
    float sc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sc[j] = (sizeof(T) == 1 && n0 + j < N) ? scale[n0 + j] : 1.0f;
#pragma unroll
    for (int ii = 0; ii < OR; ++ii) {
        const int m = m_base + tm + RB * (g + G * ii);
        if (g + G * ii >= 8 || m >= M) continue;
        const long at = (long)m * N + n0;
        float o[4];
        if constexpr (G == 1) {
            const float4 t = pb[ii * P + p];
#pragma unroll
            for (int j = 0; j < 4; ++j) o[j] = cru_c4(t, j);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) o[j] = tot[ii][j];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = sizeof(T) == 1 ? __fmul_rn(o[j], sc[j]) : o[j];
        if (vec_y) {  // n0 + 4 <= N
            if (residual) {
                const float4 r = *reinterpret_cast<const float4*>(residual + at);
#pragma unroll
                for (int j = 0; j < 4; ++j) o[j] = __fadd_rn(cru_c4(r, j), o[j]);
            }
            *reinterpret_cast<float4*>(y + at) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (n0 + j < N) y[at + j] = residual ? __fadd_rn(residual[at + j], o[j]) : o[j];
        }
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate every form linear_wide.py may launch (its FORMS), so
// `-Xptxas -v` reports their resources; NVRTC instantiates by name expression instead.
#define CRU_WIDE_I(T, BM, BN, G, WK)                   \
    template __global__ void linear_wide<T, BM, BN, G, WK>( \
        const float*, const T*, const float*, const float*, float*, int, int, int);
#define CRU_WIDE_K(T, BM, BN, G) CRU_WIDE_I(T, BM, BN, G, 16) CRU_WIDE_I(T, BM, BN, G, 32)
#define CRU_WIDE_FORMS(T)                                                            \
    CRU_WIDE_K(T, 64, 64, 1) CRU_WIDE_K(T, 64, 128, 1) CRU_WIDE_K(T, 64, 64, 2)     \
    CRU_WIDE_K(T, 32, 64, 2) CRU_WIDE_I(T, 64, 32, 2, 16) CRU_WIDE_K(T, 64, 64, 3)  \
    CRU_WIDE_K(T, 32, 64, 3) CRU_WIDE_K(T, 32, 32, 3) CRU_WIDE_I(T, 64, 64, 4, 16)  \
    CRU_WIDE_K(T, 32, 64, 4) CRU_WIDE_I(T, 32, 32, 4, 16)
CRU_WIDE_FORMS(float)
CRU_WIDE_FORMS(signed char)
#endif
