/* rows_avx2.c: RMSNorm and SwiGLU of rows.c on AVX2 + FMA, bit for bit (8 columns per
 * vector; a row's tail that does not fill a vector goes through the scalar formula). */
#include "exp_avx2.h"

static AVX2 void rmsnorm_row(const cru_rows_args *a, const float *x, float *y) {
    const int d = a->d, d8 = d & ~7;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < d8; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int i = d8; i < d; i++) l[i & 7] = fmaf(x[i], x[i], l[i & 7]);
    const float inv = 1.0f / sqrtf(cru_tree8(l) / (float)d + a->eps);
    const __m256 iv = _mm256_set1_ps(inv);
    for (int i = 0; i < d8; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv),
                                              _mm256_loadu_ps(a->w + i)));
    for (int i = d8; i < d; i++) y[i] = (x[i] * inv) * a->w[i];
}

static AVX2 void swiglu_row(const cru_rows_args *a, const float *g, float *y) {
    const int d = a->d, d8 = d & ~7;
    const float *u = g + d;
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < d8; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = cru_exp8(_mm256_xor_ps(gv, neg)); /* exp(-g): negation is exact */
        const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
    }
    for (int i = d8; i < d; i++) y[i] = (g[i] / (1.0f + cru_expf(-g[i]))) * u[i];
}

AVX2 void cru_rows_avx2(const cru_rows_args *a, long r0, long r1) {
    for (long r = r0; r < r1; r++) {
        const float *x = a->a + r * a->lda + a->col0;
        if (a->op == CRU_RMSNORM)
            rmsnorm_row(a, x, a->y + r * a->d);
        else
            swiglu_row(a, x, a->y + r * a->d);
    }
}
