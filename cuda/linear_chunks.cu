// linear_chunks.cu: the decode GEMM split over K chunks, y[m, n] = sum_k x[m, k] * W[n, k],
// for decode-size M (<= 64 rows), with a store (+ residual) or SwiGLU epilogue. Same
// canonical order as linear.cu and linear_rows.cu, so the same bits.
//
// Why: the row kernels give a CTA a few rows and all K chunks of its columns, so a layer's
// weights are re-read once per row group by few CTAs running long serial chains. Each chunk
// partial of the canonical order is an independent chain from zero, so here CTA (j, c)
// computes chunk c's partials of ALL rows for the NT columns of tile j: every weight byte
// is read once, by chunks x tiles CTAs; the partials meet in a global scratch and the last
// CTA of a tile adds them in ascending chunk order.
//
// Layout: x f32 [M, K] row-major; W [N_w, K] row-major (f32, or int8 codes + f32 scale[N_w]);
// K % 16 == 0 (every chunk loads as 16-byte vectors); y and residual f32 [M, N_out].
//   EPI 0 (store): N_w = N_out; tile j = columns j*NT .. j*NT + NT - 1.
//   EPI 1 (SwiGLU): N_w = 2F, N_out = F; tile j = gate columns f0 .. f0 + NT/2 - 1
//     (f0 = j*NT/2) and the up columns F + f0 ..; y[m, f] = swiglu(gate, up) (rowops.cuh),
//     each of gate and up finished with its own scale first.
//   Tile-local column l: part p = l / NO (NO = NT / P output columns, P = 1 or 2), weight
//     row p*N_out + j*NO + l % NO.
//   part f32 [tiles][chunks][M][NT]: a tile's partials contiguous, for its finisher.
//   counters u32 [tiles]: zero between launches (each finisher puts its tile's back to 0,
//     so launches need no memset and can be captured in CUDA graphs).
//
// Canonical order of every output (linear.cu): partial_c = fma chain over chunk c's k
// ascending from 0 (exactly kn steps for a tail chunk); total = partial_0 + partial_1 + ...
// in ascending c; int8: total * scale[n]; residual[m, n] + that, last.
//
// Thread mapping: grid (tiles, chunks, row blocks), 256 threads; MR (16, 32 or 64, the
// host's pick) rows per CTA, NT (32 or 64) columns per tile. Row block b (blockIdx.z) is
// rows b*MR .. b*MR + MR - 1 (M > 64 takes several, MR 64): a launch of its own in all but
// the grid, with its own partials region [tiles][chunks][rows][NT] (b * tiles * chunks *
// MR * NT floats in) and its own counters (b * tiles in). One block: the layout above. CTA (j, c) stages x[0:M][chunk c] in
// xs[MR][68] (rows past M zero) and the tile's weight chunk in ws[NT][68] (int8 unpacked
// exactly by cru_unpack), all with 16-byte loads: 4 * 68 * (MR + NT) bytes of static shared
// memory (34.8 KB at 64 + 64). Thread (tx = t % 16, ty = t / 16) runs RT = MR/16 rows
// ty*RT .. and CT = NT/16 tile columns tx, tx + 16, ...: RT x CT chains, x and w read from
// shared memory as float4 (4 k). Row stride 68 floats: the 8 threads of a 16-byte load
// phase read weight rows tx..tx+7, 68 floats apart: 8 different bank quads (at 64, one).
// Finisher (the CTA drawing the tile's last ticket): thread t owns 4 adjacent output
// columns (cg = t % CG) of rows rl, rl + RL, ... (rl = t / CG) and reads their partials of
// chunk 0, 1, ... from L2 (__ldcg: other SMs wrote them), adding in that order.
// PDL (pdl.cuh): weights and scales load before cru_pdl_wait; x, the residual, the scratch
// and every global write after it. No standard headers (NVRTC).
#include "gemm_common.cuh"
#include "pdl.cuh"
#include "rowops.cuh"

#define CRU_CH_LD (CRU_KC + 4)  // shared row stride in floats (see the bank note above)

__device__ __forceinline__ float4 cru_add4(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float cru_at(const float4& v, int e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// One staged 16-byte weight vector into the tile's shared rows. f32: 4 k values as they are.
// int8: 16 codes -> 16 exact floats; vectors q and q + 2 of a row would hit the same banks
// in one store phase, so the upper half stores its four float4 rotated by two.
__device__ __forceinline__ void cru_ch_put(float* row, int q, int4 v, const float*) {
    *reinterpret_cast<float4*>(row + 4 * q) =
        make_float4(__int_as_float(v.x), __int_as_float(v.y), __int_as_float(v.z),
                    __int_as_float(v.w));
}
__device__ __forceinline__ void cru_ch_put(float* row, int q, int4 v, const signed char*) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int p = (i + (q >> 1) * 2) & 3;
        float f[4];
        cru_unpack(p == 0 ? v.x : p == 1 ? v.y : p == 2 ? v.z : v.w, f);
        *reinterpret_cast<float4*>(row + 16 * q + 4 * p) = make_float4(f[0], f[1], f[2], f[3]);
    }
}

template <typename T, int NT, int MR, int EPI>
__global__ void __launch_bounds__(256)
linear_chunks(const float* __restrict__ x, const T* __restrict__ w,
              const float* __restrict__ scale, const float* __restrict__ residual,
              float* __restrict__ y, float* __restrict__ part,
              unsigned int* __restrict__ counters, int M, int N_out, int K) {
    constexpr int P = EPI == 1 ? 2 : 1;
    constexpr int NO = NT / P;                                  // output columns per tile
    constexpr int RT = MR / 16, CT = NT / 16;                   // thread tile
    constexpr int VPR = CRU_KC * (int)sizeof(T) / 16;           // 16-byte vectors per row chunk
    constexpr int WPT = (NT * VPR + 255) / 256;                 // of them per thread
    constexpr int CG = NO / 4, RL = 256 / CG, FR = (MR + RL - 1) / RL;  // finisher mapping
    static_assert(NT % 32 == 0 && MR % 16 == 0 && MR <= 64, "tile shape");
    __shared__ __align__(16) float xs[MR][CRU_CH_LD];
    __shared__ __align__(16) float ws[NT][CRU_CH_LD];
    __shared__ unsigned int ticket;
    const int tid = threadIdx.x, j = blockIdx.x, c = blockIdx.y, chunks = gridDim.y;
    {  // this CTA's row block: its rows, outputs, residual, partials and counters
        const int b = blockIdx.z, tiles = gridDim.x;
        M = min(MR, M - b * MR);
        x += (long)b * MR * K;
        y += (long)b * MR * N_out;
        if (residual != nullptr) residual += (long)b * MR * N_out;
        part += (long)b * tiles * chunks * MR * NT;
        counters += b * tiles;
    }
    const int k0 = c * CRU_KC, kn = min(CRU_KC, K - k0);
    const int cg = tid % CG, rl = tid / CG;

    // Weights and the finisher's scales: never written by a kernel of the step (pdl.cuh).
    int4 wv[WPT];
#pragma unroll
    for (int i = 0; i < WPT; ++i) {
        const int s = tid + 256 * i, l = s / VPR, q = s % VPR;
        const int col = j * NO + l % NO;
        wv[i] = make_int4(0, 0, 0, 0);
        if (s < NT * VPR && col < N_out && q * (16 / (int)sizeof(T)) < kn)
            wv[i] = __ldg(reinterpret_cast<const int4*>(w + (long)(l / NO * N_out + col) * K + k0)
                          + q);
    }
    float sc[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = j * NO + 4 * cg + e;
            sc[p][e] = (sizeof(T) == 1 && col < N_out) ? __ldg(scale + p * N_out + col) : 1.0f;
        }
    cru_pdl_wait();
    cru_pdl_trigger();
    // x: MR rows x 16 float4, RT per thread. x and the residual were written by the step's
    // previous kernel, which under PDL ran while this grid was already resident: read them
    // through L2 (__ldcg), never the non-coherent path the compiler picks for const
    // __restrict__ data.
    float4 xv[RT];
#pragma unroll
    for (int i = 0; i < RT; ++i) {
        const int s = tid + 256 * i, r = s / 16, q = s % 16;
        xv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < M && 4 * q < kn)
            xv[i] = __ldcg(reinterpret_cast<const float4*>(x + (long)r * K + k0 + 4 * q));
    }
#pragma unroll
    for (int i = 0; i < WPT; ++i) {
        const int s = tid + 256 * i;
        if (s < NT * VPR) cru_ch_put(&ws[s / VPR][0], s % VPR, wv[i], w);
    }
#pragma unroll
    for (int i = 0; i < RT; ++i) {
        const int s = tid + 256 * i;
        *reinterpret_cast<float4*>(&xs[s / 16][4 * (s % 16)]) = xv[i];
    }
    __syncthreads();

    const int tx = tid & 15, ty = tid >> 4;
    if (ty * RT < M) {  // threads whose rows are all past M have nothing to store
        float acc[RT][CT];
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
            for (int jj = 0; jj < CT; ++jj) acc[i][jj] = 0.0f;
        for (int kb = 0; kb < kn; kb += 16) {  // kn % 16 == 0: exactly kn fma steps
#pragma unroll
            for (int k = kb; k < kb + 16; k += 4) {
                float4 a[RT], b[CT];
#pragma unroll
                for (int i = 0; i < RT; ++i)
                    a[i] = *reinterpret_cast<const float4*>(&xs[ty * RT + i][k]);
#pragma unroll
                for (int jj = 0; jj < CT; ++jj)
                    b[jj] = *reinterpret_cast<const float4*>(&ws[tx + 16 * jj][k]);
#pragma unroll
                for (int i = 0; i < RT; ++i)
#pragma unroll
                    for (int jj = 0; jj < CT; ++jj) {
                        float v = acc[i][jj];
                        v = __fmaf_rn(a[i].x, b[jj].x, v);
                        v = __fmaf_rn(a[i].y, b[jj].y, v);
                        v = __fmaf_rn(a[i].z, b[jj].z, v);
                        acc[i][jj] = __fmaf_rn(a[i].w, b[jj].w, v);
                    }
            }
        }
        float* dst = part + (long)(j * chunks + c) * M * NT;
#pragma unroll
        for (int i = 0; i < RT; ++i) {
            const int r = ty * RT + i;
            if (r < M)
#pragma unroll
                for (int jj = 0; jj < CT; ++jj) dst[r * NT + tx + 16 * jj] = acc[i][jj];
        }
    }
    __threadfence();  // this CTA's partials are visible device-wide before its ticket
    __syncthreads();
    if (tid == 0) ticket = atomicAdd(counters + j, 1u);
    __syncthreads();
    if (ticket != (unsigned int)(chunks - 1)) return;
    __threadfence();
    if (tid == 0) counters[j] = 0u;  // every ticket of this launch is drawn

    // Finisher: the epilogue inputs first, so their loads overlap the partials'.
    const int col0 = j * NO + 4 * cg;
    const bool vec = (N_out & 3) == 0 && col0 + 4 <= N_out;  // 16-byte y / residual access
    float res[FR][4];
#pragma unroll
    for (int i = 0; i < FR; ++i) {
        const int r = rl + RL * i;
        const float* rp = residual + (long)r * N_out + col0;
        const bool live = EPI == 0 && residual != nullptr && r < M;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (live && vec) v = __ldcg(reinterpret_cast<const float4*>(rp));
#pragma unroll
        for (int e = 0; e < 4; ++e)
            res[i][e] = (live && !vec && col0 + e < N_out) ? __ldcg(rp + e) : cru_at(v, e);
    }
    const float* tile = part + (long)j * chunks * M * NT + 4 * cg;
    float4 tot[FR][P];
#pragma unroll
    for (int i = 0; i < FR; ++i)
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int r = rl + RL * i;
            tot[i][p] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < M)
                tot[i][p] = __ldcg(reinterpret_cast<const float4*>(tile + (long)r * NT + p * NO));
        }
#pragma unroll 4
    for (int cc = 1; cc < chunks; ++cc)
#pragma unroll
        for (int i = 0; i < FR; ++i)
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const int r = rl + RL * i;
                if (r < M)
                    tot[i][p] = cru_add4(tot[i][p], __ldcg(reinterpret_cast<const float4*>(
                                                        tile + ((long)cc * M + r) * NT + p * NO)));
            }
#pragma unroll
    for (int i = 0; i < FR; ++i) {
        const int r = rl + RL * i;
        if (r >= M) continue;
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float g = cru_rows_finish<T>(cru_at(tot[i][0], e), sc[0][e]);
            if (EPI == 1)
                o[e] = cru_swiglu(g, cru_rows_finish<T>(cru_at(tot[i][P - 1], e), sc[P - 1][e]));
            else
                o[e] = residual != nullptr ? __fadd_rn(res[i][e], g) : g;
        }
        float* yp = y + (long)r * N_out + col0;
        if (vec) {
            *reinterpret_cast<float4*>(yp) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (col0 + e < N_out) yp[e] = o[e];
        }
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate every form so `-Xptxas -v` reports their resources;
// NVRTC instantiates what it needs through name expressions instead.
#define CRU_CHUNKS_INSTANTIATE(T, NT, MR, EPI)                                             \
    template __global__ void linear_chunks<T, NT, MR, EPI>(                                \
        const float*, const T*, const float*, const float*, float*, float*, unsigned int*, \
        int, int, int);
#define CRU_CHUNKS_MR(T, NT, EPI)        \
    CRU_CHUNKS_INSTANTIATE(T, NT, 16, EPI) \
    CRU_CHUNKS_INSTANTIATE(T, NT, 32, EPI) \
    CRU_CHUNKS_INSTANTIATE(T, NT, 64, EPI)
CRU_CHUNKS_MR(float, 32, 0)
CRU_CHUNKS_MR(float, 64, 0)
CRU_CHUNKS_MR(float, 32, 1)
CRU_CHUNKS_MR(float, 64, 1)
CRU_CHUNKS_MR(signed char, 32, 0)
CRU_CHUNKS_MR(signed char, 64, 0)
CRU_CHUNKS_MR(signed char, 32, 1)
CRU_CHUNKS_MR(signed char, 64, 1)
#endif
