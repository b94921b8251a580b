/* rows.c: the row-wise ops of the forward (RMSNorm, SwiGLU, RoPE), scalar versions.
 *
 * Each output row depends on its own input row only, so threads take contiguous row
 * ranges. The orders (rows_avx2.c computes the same bits):
 *   RMSNorm: ss in 8 lanes, lane l = fma(x_i, x_i, .) over i = l, l+8, ... ascending, then
 *            cru_tree8; inv = 1 / sqrt(ss / d + eps); y = (x * inv) * w.
 *   SwiGLU:  y = (g / (1 + cru_expf(-g))) * u.
 *   RoPE:    rotate-half pairs (i, i + d/2): y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin, each
 *            product rounded, then the add (the numpy backend's own formula).
 */
#include "cpu.h"

static void rmsnorm_row(const cru_rows_args *a, const float *x, float *y) {
    float l[8] = {0};
    for (int i = 0; i < a->d; i++) l[i & 7] = fmaf(x[i], x[i], l[i & 7]);
    const float inv = 1.0f / sqrtf(cru_tree8(l) / (float)a->d + a->eps);
    for (int i = 0; i < a->d; i++) y[i] = (x[i] * inv) * a->w[i];
}

static void swiglu_row(const cru_rows_args *a, const float *g, float *y) {
    const float *u = g + a->d;
    for (int i = 0; i < a->d; i++) y[i] = (g[i] / (1.0f + cru_expf(-g[i]))) * u[i];
}

static void rope_row(const cru_rows_args *a, long r, const float *x, float *y) {
    const int half = a->d / 2;
    const float *c = a->cos + r * half, *s = a->sin + r * half;
    for (int h = 0; h < a->heads; h++) {
        const float *x1 = x + (long)h * a->d, *x2 = x1 + half;
        float *y1 = y + (long)h * a->d, *y2 = y1 + half;
        for (int i = 0; i < half; i++) {
            const float p = x1[i] * c[i], q = x2[i] * s[i];
            const float u = x2[i] * c[i], v = x1[i] * s[i];
            y1[i] = p - q;
            y2[i] = u + v;
        }
    }
}

static long out_width(const cru_rows_args *a) {
    return a->op == CRU_ROPE ? (long)a->heads * a->d : a->d;
}

void cru_rows_part(void *ctx, int part, int nparts) {
    const cru_rows_args *a = ctx;
    const long r0 = a->rows * part / nparts, r1 = a->rows * (part + 1) / nparts;
    if (r0 >= r1) return;
    if (a->avx2 && a->op != CRU_ROPE) {
        cru_rows_avx2(a, r0, r1);
        return;
    }
    for (long r = r0; r < r1; r++) {
        const float *x = a->a + r * a->lda + a->col0;
        float *y = a->y + r * out_width(a);
        if (a->op == CRU_RMSNORM)
            rmsnorm_row(a, x, y);
        else if (a->op == CRU_SWIGLU)
            swiglu_row(a, x, y);
        else
            rope_row(a, r, x, y);
    }
}
