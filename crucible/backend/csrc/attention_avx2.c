/* attention_avx2.c: attention.c's order on AVX2 + FMA, bit for bit.
 *
 * Scores: 8 keys at a time, each an 8-lane fma chain over d (lane l = d mod 8, as in the
 * scalar code); the 8 key vectors are reduced together by hadd/permute in exactly
 * cru_tree8's tree. exp and the denominator run over 8 positions per vector, positions
 * past the row's end padded with p = 0 (adding +0 to a lane changes nothing). PV keeps up
 * to 64 output dims in registers and walks the history once per 64 dims, page by page
 * (the same ascending j). History rows are found through cru_attn_page (cpu.h): an 8-key
 * group starting at an 8-aligned j lies inside one 16-position page.
 */
#include "exp_avx2.h"

/* Lane i of the result: cru_tree8 of v[i]'s 8 lanes (hadd pairs adjacent lanes). */
AVX2_INLINE __m256 tree8x8(const __m256 *v) {
    const __m256 t01 = _mm256_hadd_ps(v[0], v[1]), t23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t45 = _mm256_hadd_ps(v[4], v[5]), t67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u = _mm256_hadd_ps(t01, t23), w = _mm256_hadd_ps(t45, t67);
    return _mm256_add_ps(_mm256_permute2f128_ps(u, w, 0x20), _mm256_permute2f128_ps(u, w, 0x31));
}

AVX2_INLINE float hmax(__m256 v) {
    float l[8], m;
    _mm256_storeu_ps(l, v);
    m = l[0];
    for (int i = 1; i < 8; i++) m = l[i] > m ? l[i] : m;
    return m;
}

/* s[0 .. len) = scaled scores of q against the history's keys (page 0 at k: the head's
 * columns; pages `stride` floats apart, through tab; rows kvd floats apart); returns their
 * max. */
static AVX2 float scores(const float *q, const float *k, const int32_t *tab, size_t stride,
                         size_t kvd, int len, int hd, float scale, float *s) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 mxv = _mm256_set1_ps(-__builtin_inff());
    int j = 0;
    for (; j + 8 <= len; j += 8) {
        __m256 acc[8];
        const float *kr[8];
        const float *k0 = cru_attn_page(k, tab, stride, j >> 4) + (j & 15) * kvd;
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            acc[t] = _mm256_setzero_ps();
            kr[t] = k0 + t * kvd;
        }
        for (int d = 0; d < hd; d += 8) {
            const __m256 qd = _mm256_loadu_ps(q + d);
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) acc[t] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr[t] + d), acc[t]);
        }
        const __m256 sv = _mm256_mul_ps(tree8x8(acc), sc);
        _mm256_storeu_ps(s + j, sv);
        mxv = _mm256_max_ps(mxv, sv);
    }
    float mx = hmax(mxv);
    for (; j < len; j++) {
        const float *kj = cru_attn_page(k, tab, stride, j >> 4) + (j & 15) * kvd;
        __m256 acc = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kj + d), acc);
        s[j] = cru_tree8_avx2(acc) * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    return mx;
}

/* out[0 .. 8*NV) = (sum_j fma(p_j, v_j, .)) * recip, NV vectors of outputs in registers;
 * j ascends from 0, one page of 16 positions at a time. */
AVX2_INLINE void pv_block(const int NV, const float *p, const float *v, const int32_t *tab,
                          size_t stride, size_t kvd, int len, __m256 recip, float *out) {
    __m256 o[8];
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++) o[i] = _mm256_setzero_ps();
    for (int pg = 0, j = 0; j < len; pg++) {
        const float *vj = cru_attn_page(v, tab, stride, pg);
        const int end = len - j < 16 ? len : j + 16;
        for (; j < end; j++, vj += kvd) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
#pragma GCC unroll 8
            for (int i = 0; i < NV; i++)
                o[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), o[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(o[i], recip));
}

static AVX2 void pv(int nv, const float *p, const float *v, const int32_t *tab, size_t stride,
                    size_t kvd, int len, __m256 recip, float *out) {
    switch (nv) {
        case 8: pv_block(8, p, v, tab, stride, kvd, len, recip, out); break;
        case 7: pv_block(7, p, v, tab, stride, kvd, len, recip, out); break;
        case 6: pv_block(6, p, v, tab, stride, kvd, len, recip, out); break;
        case 5: pv_block(5, p, v, tab, stride, kvd, len, recip, out); break;
        case 4: pv_block(4, p, v, tab, stride, kvd, len, recip, out); break;
        case 3: pv_block(3, p, v, tab, stride, kvd, len, recip, out); break;
        case 2: pv_block(2, p, v, tab, stride, kvd, len, recip, out); break;
        default: pv_block(1, p, v, tab, stride, kvd, len, recip, out); break;
    }
}

AVX2 void cru_attn_task_avx2(const cru_attn_args *a, int row, int kvh, float *s) {
    const int hd = a->hd, G = a->H / a->KV;
    const size_t kvd = (size_t)a->KV * hd, off = (size_t)kvh * hd, ps = a->page_stride;
    const int32_t *tab;
    const int len = cru_attn_row(a, row, &tab), lpad = (len + 7) & ~7;
    for (int g = 0; g < G; g++) {
        const size_t at = (size_t)row * a->H * hd + (size_t)(kvh * G + g) * hd;
        const float mx = scores(a->q + at, a->k + off, tab, ps, kvd, len, hd, a->scale, s);
        for (int j = len; j < lpad; j++) s[j] = -__builtin_inff(); /* exp -> 0 */
        const __m256 mxv = _mm256_set1_ps(mx);
        __m256 den = _mm256_setzero_ps();
        for (int j = 0; j < lpad; j += 8) {
            const __m256 p = cru_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mxv));
            _mm256_storeu_ps(s + j, p);
            den = _mm256_add_ps(den, p);
        }
        const __m256 recip = _mm256_set1_ps(1.0f / cru_tree8_avx2(den));
        for (int d0 = 0; d0 < hd; d0 += 64)
            pv(hd - d0 < 64 ? (hd - d0) / 8 : 8, s, a->v + off + d0, tab, ps, kvd, len, recip,
               a->out + at + d0);
    }
}
