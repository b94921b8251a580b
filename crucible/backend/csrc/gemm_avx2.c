/* gemm_avx2.c: the canonical GEMM order (gemm.c) on AVX2 + FMA, bit-identical to the scalar
 * version: each output element still gets one fma per k in ascending order from a zero
 * chunk partial, and the chunk partials are added in ascending order.
 *
 * Microkernel: an outer product of MR rows x NP panels (16 columns each) held in MR*NP*2
 * ymm accumulators (<= 12), vectorised across n; x values are broadcast, weight panels are
 * loaded 8 columns at a time (int8 panels are widened and converted on the fly, exactly).
 * Prefill uses 6 rows x 1 panel. Small M (decode) has too few rows to hide the FMA latency
 * with one panel, so it takes several panels at once (1 x 6, 2 x 3, 3 x 2).
 *
 * Blocking: rows in blocks of MB (the block's x stays in L2); for every panel the block's
 * tiles walk the panel in turn. With many rows an int8 panel is converted once per block
 * into an f32 buffer; with few, in the microkernel. Neither choice changes a bit.
 */
#include <immintrin.h>
#include <stdlib.h>

#include "cpu.h"

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((target("avx2,fma"), always_inline))
#define X_BLOCK_BYTES (192 * 1024) /* share of the 512 KiB L2 for a row block's x */

AVX2_INLINE __m256 load8(const void *w, const int w8, size_t i) {
    if (w8)
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)w + i))));
    return _mm256_loadu_ps((const float *)w + i);
}

/* MR rows x NP panels over the whole K: chunk partials from zero, totals in `tot`. */
AVX2_INLINE void tile(const int MR, const int NP, const int W8, const float *x, size_t ldx,
                      const void *w, size_t wstride, int K, float *tot, int ldt) {
    for (int k0 = 0; k0 < K; k0 += CRU_KC) {
        const int kn = K - k0 < CRU_KC ? K - k0 : CRU_KC;
        __m256 acc[12];
#pragma GCC unroll 12
        for (int t = 0; t < MR * NP * 2; t++) acc[t] = _mm256_setzero_ps();
        for (int k = k0; k < k0 + kn; k++) {
#pragma GCC unroll 6
            for (int j = 0; j < NP; j++) {
                const __m256 b0 = load8(w, W8, j * wstride + (size_t)k * CRU_NR);
                const __m256 b1 = load8(w, W8, j * wstride + (size_t)k * CRU_NR + 8);
#pragma GCC unroll 6
                for (int i = 0; i < MR; i++) {
                    const __m256 av = _mm256_broadcast_ss(x + i * ldx + k);
                    acc[(i * NP + j) * 2] = _mm256_fmadd_ps(av, b0, acc[(i * NP + j) * 2]);
                    acc[(i * NP + j) * 2 + 1] = _mm256_fmadd_ps(av, b1, acc[(i * NP + j) * 2 + 1]);
                }
            }
        }
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
#pragma GCC unroll 6
            for (int j = 0; j < NP; j++) {
                float *t = tot + i * ldt + j * CRU_NR;
                __m256 lo = acc[(i * NP + j) * 2], hi = acc[(i * NP + j) * 2 + 1];
                if (k0 > 0) {
                    lo = _mm256_add_ps(_mm256_loadu_ps(t), lo);
                    hi = _mm256_add_ps(_mm256_loadu_ps(t + 8), hi);
                }
                _mm256_storeu_ps(t, lo);
                _mm256_storeu_ps(t + 8, hi);
            }
        }
    }
}

typedef void (*tile_fn)(const float *, size_t, const void *, size_t, int, float *, int);

#define DEF_TILE(MR, NP, W8)                                                                  \
    static AVX2 void tile_##MR##_##NP##_##W8(const float *x, size_t ldx, const void *w,      \
                                             size_t ws, int K, float *tot, int ldt) {        \
        tile(MR, NP, W8, x, ldx, w, ws, K, tot, ldt);                                        \
    }
#define DEF_W(MR, NP) DEF_TILE(MR, NP, 0) DEF_TILE(MR, NP, 1)
DEF_W(1, 1) DEF_W(2, 1) DEF_W(3, 1) DEF_W(4, 1) DEF_W(5, 1) DEF_W(6, 1)
DEF_W(1, 6) DEF_W(2, 3) DEF_W(3, 2)

static tile_fn pick(int mr, int np, int w8) {
    static const tile_fn one[7][2] = {{0, 0},
                                      {tile_1_1_0, tile_1_1_1}, {tile_2_1_0, tile_2_1_1},
                                      {tile_3_1_0, tile_3_1_1}, {tile_4_1_0, tile_4_1_1},
                                      {tile_5_1_0, tile_5_1_1}, {tile_6_1_0, tile_6_1_1}};
    if (np == 6) return w8 ? tile_1_6_1 : tile_1_6_0;
    if (np == 3) return w8 ? tile_2_3_1 : tile_2_3_0;
    if (np == 2) return w8 ? tile_3_2_1 : tile_3_2_0;
    return one[mr][w8];
}

/* Widen one int8 panel [K][16] to f32 (exact). */
static AVX2 void convert_panel(const int8_t *src, float *dst, int K) {
    for (size_t i = 0; i < (size_t)K * CRU_NR; i += 8) _mm256_storeu_ps(dst + i, load8(src, 1, i));
}

AVX2 void cru_gemm_panels_avx2(const cru_gemm_args *a, int p0, int p1) {
    const int K = a->K;
    const size_t pstride = (size_t)K * CRU_NR;
    int mb_max = X_BLOCK_BYTES / (4 * K) / 6 * 6;
    mb_max = mb_max < 6 ? 6 : mb_max;
    float tot_small[6 * 6 * CRU_NR];
    float *tot = a->M >= 6 ? malloc(sizeof(float) * (size_t)mb_max * CRU_NR) : tot_small;
    float *wbuf = a->w_int8 && a->M >= 6 ? malloc(sizeof(float) * pstride) : NULL;
    if ((a->M >= 6 && !tot) || (a->w_int8 && a->M >= 6 && !wbuf)) {
        free(a->M >= 6 ? tot : NULL);
        free(wbuf);
        cru_gemm_panels_scalar(a, p0, p1); /* out of memory: slow but the same bits */
        return;
    }
    for (int m0 = 0; m0 < a->M; m0 += mb_max) {
        const int mb = a->M - m0 < mb_max ? a->M - m0 : mb_max;
        const int group = mb >= 4 ? 1 : 6 / mb; /* panels per microkernel call */
        const int convert = wbuf != NULL && mb >= 6;
        const float *xb = a->x + (size_t)m0 * K;
        for (int p = p0; p < p1;) {
            const int np = p1 - p >= group ? group : 1;
            const void *w = (const char *)a->w + (a->w_int8 ? 1 : 4) * (size_t)p * pstride;
            int w8 = a->w_int8;
            if (convert) {
                convert_panel(w, wbuf, K);
                w = wbuf;
                w8 = 0;
            }
            const int ldt = np * CRU_NR;
            for (int i = 0; i < mb; i += 6) {
                const int mr = mb - i < 6 ? mb - i : 6;
                pick(np == 1 ? mr : mb, np, w8)(xb + (size_t)i * K, K, w, pstride, K,
                                                 tot + i * ldt, ldt);
            }
            for (int i = 0; i < mb; i++)
                for (int j = 0; j < np; j++) cru_gemm_finish(a, m0 + i, p + j, tot + i * ldt + j * CRU_NR);
            p += np;
        }
    }
    if (tot != tot_small) free(tot);
    free(wbuf);
}
