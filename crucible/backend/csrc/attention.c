/* attention.c: causal paged attention, scalar version.
 *
 * Two callers: the numpy backend hands a whole step here at once, each row reading its
 * K/V history straight from the pool through its page table (cpu_ops.paged_attention);
 * cpu_ops.attention hands one segment's rows and a gathered, contiguous history. Only the
 * address of history position j differs (cru_attn_page, cpu.h). Each (query row, query
 * head) is one distribution, computed alone in this order (the CPU's canonical attention
 * order):
 *   s_j = dot(q, k_j) * scale for j = 0 .. end (the row's own position): the dot keeps 8
 *         lanes, lane l = fma chain over d = l, l+8, ... ascending, then cru_tree8;
 *   mx = max_j s_j (exact in any order); p_j = cru_expf(s_j - mx);
 *   denominator: 8 lanes, lane l adds p_j for j = l, l+8, ... ascending, then cru_tree8;
 *   o[d] = fma(p_j, v_j[d], o[d]) for j ascending from 0; out = o * (1 / denominator).
 * Nothing depends on other rows, on where the row sits in the step, on how the prompt was
 * chunked or which pages hold the history. attention_avx2.c computes the same bits.
 * Threads take (row, KV head) tasks round-robin over all rows of the call; a task owns its
 * G query heads, so no reduction is ever split.
 */
#include "cpu.h"

void cru_attn_task_scalar(const cru_attn_args *a, int row, int kvh, float *s) {
    const int hd = a->hd, G = a->H / a->KV;
    const size_t kvd = (size_t)a->KV * hd, off = (size_t)kvh * hd, ps = a->page_stride;
    const int32_t *tab;
    const int len = cru_attn_row(a, row, &tab);
    for (int g = 0; g < G; g++) {
        const size_t at = (size_t)row * a->H * hd + (size_t)(kvh * G + g) * hd;
        const float *q = a->q + at;
        float mx = -__builtin_inff();
        for (int j = 0; j < len; j++) {
            const float *k = cru_attn_page(a->k + off, tab, ps, j >> 4) + (j & 15) * kvd;
            float l[8] = {0};
            for (int d = 0; d < hd; d += 8)
                for (int i = 0; i < 8; i++) l[i] = fmaf(q[d + i], k[d + i], l[i]);
            s[j] = cru_tree8(l) * a->scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        float den[8] = {0};
        for (int j = 0; j < len; j++) {
            s[j] = cru_expf(s[j] - mx);
            den[j & 7] = den[j & 7] + s[j];
        }
        const float recip = 1.0f / cru_tree8(den);
        float *o = a->out + at;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int j = 0; j < len; j++) {
            const float *v = cru_attn_page(a->v + off, tab, ps, j >> 4) + (j & 15) * kvd;
            for (int d = 0; d < hd; d++) o[d] = fmaf(s[j], v[d], o[d]);
        }
        for (int d = 0; d < hd; d++) o[d] = o[d] * recip;
    }
}

void cru_attn_part(void *ctx, int part, int nparts) {
    const cru_attn_args *a = ctx;
    float *s = a->scratch + part * a->scratch_len;
    const long tasks = (long)a->n * a->KV;
    for (long t = part; t < tasks; t += nparts) {
        if (a->avx2)
            cru_attn_task_avx2(a, (int)(t / a->KV), (int)(t % a->KV), s);
        else
            cru_attn_task_scalar(a, (int)(t / a->KV), (int)(t % a->KV), s);
    }
}
