/* cpu.h: shared declarations of the compiled CPU kernels (module crucible.backend._cpu).
 *
 * Every kernel has a portable scalar version and an AVX2+FMA version that give the same
 * bits: both spell out the same roundings (explicit fmaf / _mm256_fmadd_ps where a fused
 * multiply-add is meant, a separately rounded multiply and add everywhere else; the build
 * passes -ffp-contract=off so the compiler adds no fusion of its own). Work is split
 * across threads by output column or by row; no reduction ever crosses a split, so the
 * thread count changes speed, never bits.
 */
#ifndef CRUCIBLE_CPU_H
#define CRUCIBLE_CPU_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>

#define CRU_KC 64 /* K chunk of the canonical GEMM order (cuda/linear.cu) */
#define CRU_NR 16 /* output columns per packed weight panel */
#define CRU_GEMM_UNIT 6 /* panels per unit of work of a thread */

/* ---- thread pool (pool.c) ---- */
typedef void (*cru_part_fn)(void *ctx, int part, int nparts);
/* Run fn(ctx, p, nparts) for p = 0 .. nparts-1 on up to nthreads threads (the caller
 * included); returns when all are done. Safe to call from several threads at once. */
void cru_pool_run(cru_part_fn fn, void *ctx, int nparts, int nthreads);
/* How many parts to cut `units` of work into for `threads` threads: a few per thread, so
 * a thread that starts late (a busy machine) leaves its share to the others. */
static inline int cru_parts(long units, int threads) {
    long p = threads <= 1 ? 1 : 4L * threads;
    return (int)(units < p ? (units > 0 ? units : 1) : p);
}

/* ---- dispatch (module.c) ---- */
int cru_have_avx2(void); /* the CPU and OS support AVX2 and FMA */

/* ---- GEMM (gemm.c) ---- */
typedef struct {
    const float *x;     /* [M, K] row-major */
    const void *w;      /* packed panels [P][K][16], f32 or int8, zero past N */
    int w_int8;
    const float *scale; /* [N], int8 only */
    const float *res;   /* [M, N] or NULL: added last */
    float *y;           /* [M, N] */
    int M, N, K, P;
    int avx2;
} cru_gemm_args;
void cru_gemm_part(void *ctx, int part, int nparts); /* ctx: cru_gemm_args */

/* The tail of the canonical order for one row of one panel: total -> y. Plain f32
 * operations, each rounded once (no contraction: -ffp-contract=off). */
static inline void cru_gemm_finish(const cru_gemm_args *a, int m, int p, const float *tot) {
    int n0 = p * CRU_NR, nn = a->N - n0 < CRU_NR ? a->N - n0 : CRU_NR;
    size_t row = (size_t)m * a->N + n0;
    for (int j = 0; j < nn; j++) {
        float v = tot[j];
        if (a->w_int8) v = v * a->scale[n0 + j];
        if (a->res) v = a->res[row + j] + v;
        a->y[row + j] = v;
    }
}
void cru_gemm_panels_scalar(const cru_gemm_args *a, int p0, int p1);
void cru_gemm_panels_avx2(const cru_gemm_args *a, int p0, int p1);

/* ---- attention (attention.c, attention_avx2.c) ---- */
/* Where a row's history lives. Position p is row k + page(p >> 4) * page_stride +
 * (p & 15) * KV*hd (and the same in v), page(i) = tab[i] for the row's page table tab, or
 * i itself where there is none (a gathered, contiguous history: page_stride = 16*KV*hd).
 * A page holds 16 positions, so the 8 keys j .. j+7 of an 8-aligned j share one page. */
typedef struct {
    const float *q;   /* [n, H*hd] query rows */
    const float *k;   /* page 0 of the history: the pool at the layer, or a gathered copy */
    const float *v;
    float *out;       /* [n, H*hd] */
    int n, H, KV, hd;
    size_t page_stride;       /* floats from one page to the next */
    const int32_t *tables;    /* [*, table_len] page tables, or NULL (contiguous) */
    long table_len;
    const int32_t *rows;      /* [n, 2]: (absolute position, table index); NULL: see first */
    int first;        /* rows == NULL: row r sits at first + r */
    float scale;      /* 1/sqrt(hd) as f32 */
    int avx2;
    float *scratch;   /* per part: scratch_len floats (the scores of one head) */
    long scratch_len;
} cru_attn_args;
void cru_attn_part(void *ctx, int part, int nparts);
void cru_attn_task_scalar(const cru_attn_args *a, int row, int kvh, float *buf);
void cru_attn_task_avx2(const cru_attn_args *a, int row, int kvh, float *buf);

/* The history length of `row` (its own position + 1); *tab = its page table or NULL. */
static inline int cru_attn_row(const cru_attn_args *a, int row, const int32_t **tab) {
    if (!a->rows) {
        *tab = NULL;
        return a->first + row + 1;
    }
    *tab = a->tables + (size_t)a->rows[2 * row + 1] * a->table_len;
    return a->rows[2 * row] + 1;
}

/* Page i of a history whose page 0 is `base`. */
static inline const float *cru_attn_page(const float *base, const int32_t *tab, size_t stride,
                                         int i) {
    return base + (size_t)(tab ? tab[i] : i) * stride;
}

/* ---- row-wise ops (rows.c, rows_avx2.c) ---- */
typedef struct {
    int op;                 /* CRU_RMSNORM, CRU_SWIGLU, CRU_ROPE */
    const float *a;         /* input rows, lda floats apart, starting at column col0 */
    long lda, col0;
    const float *w;         /* rmsnorm: weight [d] */
    float *y;               /* output rows [rows, d] (rope: [rows, heads * d]) */
    long rows;
    int d;                  /* rmsnorm: features; swiglu: F (a row is [gate F | up F]);
                               rope: head_dim */
    float eps;
    const float *cos, *sin; /* rope: [rows, d/2], the angles of each row's position */
    int heads;
    int avx2;
} cru_rows_args;
enum { CRU_RMSNORM = 1, CRU_SWIGLU = 2, CRU_ROPE = 3 };
void cru_rows_part(void *ctx, int part, int nparts);
void cru_rows_avx2(const cru_rows_args *a, long r0, long r1);

/* exp(x) in f32, the same bits in the scalar and AVX2 versions (exp_avx2.h), not libm's:
 * n = nearest(x * log2(e)), r = x - n*ln2 in two fma steps, a degree-5 polynomial in r by
 * fma (Horner), times 2^n. Below ln(FLT_MIN) it returns 0 (no subnormal results), above
 * 88.376 (where 2^n would need n = 128) +inf; NaN stays NaN. */
#define CRU_EXP_LO (-87.33654f)
#define CRU_EXP_HI 88.37626f
#define CRU_LOG2E 1.44269504088896341f
#define CRU_LN2_HI 0.693359375f
#define CRU_LN2_LO (-2.12194440e-4f)
#define CRU_ROUND 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds to integer */
static const float cru_exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float cru_expf(float x) {
    if (x != x) return x;
    if (x < CRU_EXP_LO) return 0.0f;
    if (x > CRU_EXP_HI) return __builtin_inff();
    float n = (x * CRU_LOG2E + CRU_ROUND) - CRU_ROUND;
    float r = fmaf(n, -CRU_LN2_HI, x);
    r = fmaf(n, -CRU_LN2_LO, r);
    float p = cru_exp_poly[0];
    for (int i = 1; i < 6; i++) p = fmaf(p, r, cru_exp_poly[i]);
    float y = fmaf(p, r * r, r) + 1.0f;
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return y * two_n.f;
}

/* The fixed tree that reduces 8 lanes: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). */
static inline float cru_tree8(const float *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

#endif
