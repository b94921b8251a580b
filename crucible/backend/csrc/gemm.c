/* gemm.c: the canonical batch-invariant GEMM, scalar version, and the split across threads.
 *
 * y[m, n] = sum_k x[m, k] * w[k, n] in exactly the order of cuda/linear.cu:
 *   K is cut into chunks of CRU_KC = 64 at offsets 0, 64, 128, ...;
 *   partial_c = 0; partial_c = fma(x[m,k], w[k,n], partial_c) for k ascending in chunk c;
 *   total = partial_0; total = total + partial_c for c = 1, 2, ... ascending;
 *   int8: y = total * scale[n]; with a residual: y = residual[m, n] + y.
 * Nothing in that order mentions M, a row's position or the thread count, so every row's
 * bits are the same alone or in any batch, and the same as the GPU kernels'.
 *
 * Weights are packed once at load time into panels of 16 output columns, each K-major:
 * panel p holds w[k, 16p + j] at [p][k][j] (zero past N), f32 or int8. int8 codes stay
 * int8 in memory (a quarter of the traffic) and convert to float exactly in the kernel.
 * Threads split the panels (output columns); a row's reduction never crosses threads.
 */
#include <math.h>

#include "cpu.h"

static inline float w_at(const cru_gemm_args *a, size_t i) {
    return a->w_int8 ? (float)((const int8_t *)a->w)[i] : ((const float *)a->w)[i];
}

/* The reference spelling of the order: one row, one panel at a time, fmaf for the fma. */
void cru_gemm_panels_scalar(const cru_gemm_args *a, int p0, int p1) {
    const int K = a->K;
    float acc[CRU_NR], tot[CRU_NR];
    for (int m = 0; m < a->M; m++) {
        const float *xr = a->x + (size_t)m * K;
        for (int p = p0; p < p1; p++) {
            const size_t base = (size_t)p * K * CRU_NR;
            for (int k0 = 0; k0 < K; k0 += CRU_KC) {
                const int k1 = K - k0 < CRU_KC ? K : k0 + CRU_KC;
                for (int j = 0; j < CRU_NR; j++) acc[j] = 0.0f;
                for (int k = k0; k < k1; k++) {
                    const float xv = xr[k];
                    for (int j = 0; j < CRU_NR; j++)
                        acc[j] = fmaf(xv, w_at(a, base + (size_t)k * CRU_NR + j), acc[j]);
                }
                for (int j = 0; j < CRU_NR; j++) tot[j] = k0 == 0 ? acc[j] : tot[j] + acc[j];
            }
            cru_gemm_finish(a, m, p, tot);
        }
    }
}

/* Part `part` of `nparts` takes a contiguous range of panels (whole output columns), in
 * units of CRU_GEMM_UNIT panels (the widest microkernel of a one-row step). */
void cru_gemm_part(void *ctx, int part, int nparts) {
    const cru_gemm_args *a = ctx;
    const long units = (a->P + CRU_GEMM_UNIT - 1) / CRU_GEMM_UNIT;
    const int p0 = (int)(units * part / nparts) * CRU_GEMM_UNIT;
    int p1 = (int)(units * (part + 1) / nparts) * CRU_GEMM_UNIT;
    p1 = p1 < a->P ? p1 : a->P;
    if (p0 >= p1) return;
    if (a->avx2)
        cru_gemm_panels_avx2(a, p0, p1);
    else
        cru_gemm_panels_scalar(a, p0, p1);
}
