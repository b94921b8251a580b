/* exp_avx2.h: cru_expf (cpu.h) on 8 lanes, the same operations in the same order. */
#ifndef CRUCIBLE_EXP_AVX2_H
#define CRUCIBLE_EXP_AVX2_H

#include <immintrin.h>

#include "cpu.h"

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE static inline __attribute__((target("avx2,fma"), always_inline))

AVX2_INLINE __m256 cru_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(CRU_EXP_LO), hi = _mm256_set1_ps(CRU_EXP_HI);
    const __m256 rnd = _mm256_set1_ps(CRU_ROUND);
    /* In range xc == x; out of range (and NaN) the lanes are replaced below. */
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(CRU_LOG2E)),
                                                 rnd), rnd);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CRU_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CRU_LN2_LO), r);
    __m256 p = _mm256_set1_ps(cru_exp_poly[0]);
    for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(cru_exp_poly[i]));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Reduce 8 lanes with cru_tree8's tree. */
AVX2_INLINE float cru_tree8_avx2(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return cru_tree8(l);
}

#endif
