// attention.cu: paged causal attention over the canonical page pool, f32, head_dim 64.
//
// Layout
//   q, out   [T, n_heads*64] packed rows; row packed_start+r of a segment sits at absolute
//            position absolute_start+r and attends to positions 0..absolute_start+r.
//   k/v pool [num_pages][n_layers][16][kv_dim], kv_dim = n_kv_heads*64; position p of a
//            request is slot p&15 of page table[p>>4]. Pages are never assumed adjacent:
//            every 16 positions are translated on their own.
//   segs     int4[S] = (packed_start, chunk_len, absolute_start, table_index), ascending.
//   tables   int32[S_tables][table_stride].
//   Query head h reads KV head h / G, G = n_heads / n_kv_heads (1..8).
//
// Kernels (arithmetic spelled once in common.cuh)
//   attn_reference        grid (n_heads, T), 256 threads; the canonical order (DESIGN s.5).
//                         Dynamic smem: capacity C floats of scores.
//   attn_exact<Q, KT, CACHE> grid (n_kv_heads, ceil(max_chunk/Q), S), 32*Q*G threads.
//                         One CTA = one segment x one KV head x Q adjacent rows; its Q*G
//                         (row, head) "distributions" share every K/V tile staged in smem.
//                         Bit-identical to the reference: QK replays the warp's xor tree
//                         sequentially in one thread (tree-ordered K staging), softmax
//                         replays the reference's 8 virtual warps, PV runs the same
//                         ascending fused chain (attention_pv.cuh: four distributions a
//                         thread at Q = 4). Dynamic smem 4*(KT*68 + Q*G*64 + 96 + Q*G*C).
//                         CACHE (diagnostic "-cache" names) first copies the tile's page-table
//                         entries into smem (+C/4 bytes) so both passes translate from there.
//   attn_exact_pf         attn_exact<4, 64, false> with each tile's loads issued a tile ahead
//                         into registers (attention_prefetch.cuh); 384 threads only.
//   attn_online<Q, KT>    same grid/tiles, flash-style running max/denominator/output with
//                         tile-sized score scratch. Reorders f32 work: diagnostic only.
// Tile helpers shared by both tiled families (staging, tree dots, PV ownership) live in
// common.cuh beside the arithmetic spelling.
// Assumptions: the wrapper checks shapes; C is a multiple of 256 >= every row's causal
// length; only positions < the tile's longest causal length are read, so pages beyond a
// request's end are never touched. No standard headers (NVRTC).
#include "attention_prefetch.cuh"
#include "attention_pv.cuh"
#include "common.cuh"

#ifndef CRU_DYNAMIC_SMEM  // tests/cuda_host/prelude.h maps it onto one host buffer
#define CRU_DYNAMIC_SMEM(T, name) extern __shared__ T name[]
#endif


// ------------------------------------------------------------------------------------
// Reference: one CTA per (query head, packed row); the canonical order itself.
// ------------------------------------------------------------------------------------
__global__ void __launch_bounds__(256, 4)
attn_reference(const float* __restrict__ q, const float* __restrict__ k_pool,
               const float* __restrict__ v_pool, const int4* __restrict__ segs, int n_segs,
               const int* __restrict__ tables, int table_stride, float* __restrict__ out,
               int n_heads, int n_kv_heads, int n_layers, int layer) {
    CRU_DYNAMIC_SMEM(float, scores);
    __shared__ float red[8];
    __shared__ float bcast;
    const int head = blockIdx.x, row = blockIdx.y;
    int lo = 0, hi = n_segs - 1;  // last segment starting at or before this row
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (segs[mid].x <= row) lo = mid; else hi = mid - 1;
    }
    const int4 sd = segs[lo];
    const int r = row - sd.x;
    if (r < 0 || r >= sd.y) return;  // uniform for the whole CTA
    const int len = sd.z + r + 1;
    const int kvh = head / (n_heads / n_kv_heads), kv_dim = n_kv_heads * CRU_HEAD_DIM;
    const int* table = tables + (long long)sd.w * table_stride;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* qrow = q + ((long long)row * n_heads + head) * CRU_HEAD_DIM;
    const float q_lo = qrow[lane], q_hi = qrow[lane + 32];

    for (int j = warp; j < len; j += 8) {
        const float* kr = k_pool + cru_pool_row(table, j, n_layers, layer, kv_dim, kvh);
        const float s = cru_warp_sum(cru_leaf(q_lo, q_hi, kr[lane], kr[lane + 32]));
        if (lane == 0) scores[j] = cru_scale(s);
    }
    __syncthreads();
    const float inv = cru_ref_softmax(scores, len, red, &bcast);
    if (tid < CRU_HEAD_DIM) {
        float acc = 0.0f;
        for (int page0 = 0; page0 < len; page0 += 16) {  // translate each page once
            const float* vp = v_pool + cru_pool_row(table, page0, n_layers, layer, kv_dim, kvh);
            const int n = min(16, len - page0);
            for (int s = 0; s < n; ++s) acc = cru_pv(scores[page0 + s], vp[s * kv_dim + tid], acc);
        }
        out[((long long)row * n_heads + head) * CRU_HEAD_DIM + tid] = __fmul_rn(acc, inv);
    }
}

// ------------------------------------------------------------------------------------
// Exact tiled GQA: full score vectors in smem, K pass then V pass over the same buffer.
// ------------------------------------------------------------------------------------
// The body of attn_exact and attn_exact_pf. PF (attention_prefetch.cuh): the next tile's
// loads in flight while a tile is computed.
template <int Q, int KT, bool CACHE, bool PF>
__device__ __forceinline__ void
cru_attn_exact(const float* __restrict__ q, const float* __restrict__ k_pool,
               const float* __restrict__ v_pool, const int4* __restrict__ segs,
               const int* __restrict__ tables, int table_stride, float* __restrict__ out,
               int n_heads, int n_kv_heads, int n_layers, int layer, int capacity) {
    CRU_DYNAMIC_SMEM(float4, smem4);
    TileJob t = cru_tile_job(segs, tables, table_stride, n_heads, n_kv_heads, Q);
    if (t.n_rows == 0) return;  // ragged segment: uniform early exit
    const int kv_dim = n_kv_heads * CRU_HEAD_DIM, lane = threadIdx.x & 31;
    float* kv = reinterpret_cast<float*>(smem4);
    float* q_s = kv + KT * CRU_KV_STRIDE;
    int* lens = reinterpret_cast<int*>(q_s + t.nw * CRU_HEAD_DIM);
    float* inv_s = reinterpret_cast<float*>(lens + 32);
    float* scores = inv_s + 64;
    if (CACHE) {  // visible to staging after the first barrier of pass 1
        int* table_s = reinterpret_cast<int*>(scores + t.nw * capacity);
        for (int i = threadIdx.x; i < (t.lmax + 15) >> 4; i += blockDim.x) table_s[i] = t.table[i];
        t.table = table_s;
    }
    cru_stage_q(q_s, lens, q, t, n_heads);
    CruTileRegs<KT> next;  // PF: the next tile, loaded one tile ahead
    if (PF) next.load(k_pool, t, 0, n_layers, layer, kv_dim);

    for (int base = 0; base < t.lmax; base += KT) {  // pass 1: K -> full score vectors
        __syncthreads();
        if (PF) next.template store<true>(kv, t, base);
        else cru_stage<KT, true>(kv, k_pool, t, base, n_layers, layer, kv_dim);
        __syncthreads();
        if (PF) {  // after the last K tile, V tile 0: its loads run through the softmax
            const bool more = base + KT < t.lmax;
            next.load(more ? k_pool : v_pool, t, more ? base + KT : 0, n_layers, layer, kv_dim);
        }
        cru_qk_tile<KT>(kv, q_s, lens, scores, capacity, 0, base, t.nw);
    }
    __syncthreads();

    // Softmax: warp w owns distribution w and replays the reference's 8 virtual warps.
    const int w = threadIdx.x >> 5, len = lens[w];
    if (len > 0) {
        float* s = scores + w * capacity;
        float m = CRU_NEG_INF;  // max is exact in any order; no replay needed
        for (int j = lane; j < len; j += 32) m = fmaxf(m, s[j]);
        m = cru_warp_max(m);
        float part[8];
#pragma unroll
        for (int vw = 0; vw < 8; ++vw) {  // virtual thread 32*vw + lane, stride 256
            part[vw] = 0.0f;
            for (int j = vw * 32 + lane; j < len; j += 256) {
                const float e = cru_exp_shifted(s[j], m);
                s[j] = e;
                part[vw] = cru_add(part[vw], e);
            }
        }
        float tot = cru_warp_sum(part[0]);
#pragma unroll
        for (int vw = 1; vw < 8; ++vw) tot = cru_add(tot, cru_warp_sum(part[vw]));
        if (lane == 0) inv_s[w] = cru_recip(tot);
    }

    // Pass 2: V, ascending fused chains (attention_pv.cuh); four distributions a thread
    // where they come in fours, else cru_pv_slots' two.
    if constexpr (Q % 4 == 0) {
        const PvQuad p = cru_pv_quad(t.nw, lens);
        const int lo = t.sd.z + t.r0 + 1;  // row 0's causal length: the tile's shortest
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int base = 0; base < t.lmax; base += KT) {
            __syncthreads();
            if (PF) next.template store<false>(kv, t, base);
            else cru_stage<KT, false>(kv, v_pool, t, base, n_layers, layer, kv_dim);
            __syncthreads();
            if (PF && base + KT < t.lmax) next.load(v_pool, t, base + KT, n_layers, layer, kv_dim);
            cru_pv_quad_tile(p, kv, scores, capacity, base, min(KT, t.lmax - base), lo, acc);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (p.len[i] > 0)
                cru_store_out(out, t, n_heads, p.d0 + i, p.dim, __fmul_rn(acc[i], inv_s[p.d0 + i]));
    } else {
        const PvSlots p = cru_pv_slots(t.nw);
        const int len_a = lens[p.da], len_b = lens[p.db];
        float acc_a = 0.0f, acc_b = 0.0f;
        for (int base = 0; base < t.lmax; base += KT) {
            __syncthreads();
            cru_stage<KT, false>(kv, v_pool, t, base, n_layers, layer, kv_dim);
            __syncthreads();
            cru_pv_pair_tile(p, kv, scores + p.da * capacity, scores + p.db * capacity, base,
                             min(KT, t.lmax - base), len_a, len_b, acc_a, acc_b);
        }
        if (len_a > 0) cru_store_out(out, t, n_heads, p.da, p.dim_a, __fmul_rn(acc_a, inv_s[p.da]));
        if (len_b > 0) cru_store_out(out, t, n_heads, p.db, p.dim_b, __fmul_rn(acc_b, inv_s[p.db]));
    }
}

#define CRU_EXACT_ARGS                                                                  \
    const float* __restrict__ q, const float* __restrict__ k_pool,                      \
        const float* __restrict__ v_pool, const int4* __restrict__ segs,                \
        const int* __restrict__ tables, int table_stride, float* __restrict__ out,      \
        int n_heads, int n_kv_heads, int n_layers, int layer, int capacity
#define CRU_EXACT_PASS                                                                  \
    q, k_pool, v_pool, segs, tables, table_stride, out, n_heads, n_kv_heads, n_layers,  \
        layer, capacity

template <int Q, int KT, bool CACHE>
__global__ void __launch_bounds__(32 * Q * 8) attn_exact(CRU_EXACT_ARGS) {
    cru_attn_exact<Q, KT, CACHE, false>(CRU_EXACT_PASS);
}

// q4-k64 with each tile's loads a tile ahead: launched only with 384 threads (group 3); its
// bound of two CTAs an SM lets it take the registers the prefetch needs (80 against the
// plain instance's 56), and it is faster than the plain one even where that fits three
// (variants.PREFETCH).
__global__ void __launch_bounds__(384, 2) attn_exact_pf(CRU_EXACT_ARGS) {
    cru_attn_exact<4, 64, false, true>(CRU_EXACT_PASS);
}

// ------------------------------------------------------------------------------------
// Online (flash-style) diagnostic family: tile-sized scores, running m / l / output.
// ------------------------------------------------------------------------------------
template <int Q, int KT>
__global__ void __launch_bounds__(32 * Q * 8)
attn_online(const float* __restrict__ q, const float* __restrict__ k_pool,
            const float* __restrict__ v_pool, const int4* __restrict__ segs,
            const int* __restrict__ tables, int table_stride, float* __restrict__ out,
            int n_heads, int n_kv_heads, int n_layers, int layer, int capacity) {
    CRU_DYNAMIC_SMEM(float4, smem4);
    const TileJob t = cru_tile_job(segs, tables, table_stride, n_heads, n_kv_heads, Q);
    if (t.n_rows == 0) return;
    const int kv_dim = n_kv_heads * CRU_HEAD_DIM, lane = threadIdx.x & 31;
    float* kv = reinterpret_cast<float*>(smem4);
    float* q_s = kv + KT * CRU_KV_STRIDE;
    int* lens = reinterpret_cast<int*>(q_s + t.nw * CRU_HEAD_DIM);
    float* run_l = reinterpret_cast<float*>(lens + 32);
    float* alpha_s = run_l + 32;
    float* scores = alpha_s + 32;  // [nw][KT]
    cru_stage_q(q_s, lens, q, t, n_heads);
    const int w = threadIdx.x >> 5;
    float run_m = CRU_NEG_INF;  // lane-replicated running max of distribution w
    if (threadIdx.x < 32) run_l[threadIdx.x] = 0.0f;

    const PvSlots p = cru_pv_slots(t.nw);
    float acc_a = 0.0f, acc_b = 0.0f;
    for (int base = 0; base < t.lmax; base += KT) {
        __syncthreads();
        cru_stage<KT, true>(kv, k_pool, t, base, n_layers, layer, kv_dim);
        __syncthreads();
        cru_qk_tile<KT>(kv, q_s, lens, scores, KT, base, base, t.nw);
        __syncthreads();
        const int n = min(KT, lens[w] - base);
        if (n > 0) {
            float* s = scores + w * KT;
            float tmax = CRU_NEG_INF;
            for (int j = lane; j < n; j += 32) tmax = fmaxf(tmax, s[j]);
            const float m_new = fmaxf(run_m, cru_warp_max(tmax));
            float psum = 0.0f;
            for (int j = lane; j < n; j += 32) {
                const float e = cru_exp_shifted(s[j], m_new);
                s[j] = e;
                psum += e;
            }
            psum = cru_warp_sum(psum);
            const float alpha = __expf(run_m - m_new);  // 0 on the first visible tile
            run_m = m_new;
            if (lane == 0) {
                run_l[w] = run_l[w] * alpha + psum;
                alpha_s[w] = alpha;
            }
        } else if (lane == 0) {
            alpha_s[w] = 1.0f;
        }
        __syncthreads();  // scores/alpha published; K no longer read
        cru_stage<KT, false>(kv, v_pool, t, base, n_layers, layer, kv_dim);
        __syncthreads();
        const int na = min(KT, lens[p.da] - base), nb = min(KT, lens[p.db] - base);
        acc_a *= alpha_s[p.da];
        acc_b *= alpha_s[p.db];
        for (int jj = 0; jj < na; ++jj)
            acc_a = fmaf(scores[p.da * KT + jj], kv[jj * CRU_KV_STRIDE + p.dim_a], acc_a);
        for (int jj = 0; jj < nb; ++jj)
            acc_b = fmaf(scores[p.db * KT + jj], kv[jj * CRU_KV_STRIDE + p.dim_b], acc_b);
    }
    __syncthreads();
    if (lens[p.da] > 0) cru_store_out(out, t, n_heads, p.da, p.dim_a, acc_a / run_l[p.da]);
    if (lens[p.db] > 0) cru_store_out(out, t, n_heads, p.db, p.dim_b, acc_b / run_l[p.db]);
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate the headline variants so `-Xptxas -v` reports
// their resources; NVRTC instantiates what it needs through name expressions instead.
#define CRU_INSTANTIATE(KERNEL, ...)                                                       \
    template __global__ void KERNEL<__VA_ARGS__>(const float*, const float*, const float*, \
                                                 const int4*, const int*, int, float*, int, \
                                                 int, int, int, int);
CRU_INSTANTIATE(attn_exact, 4, 64, false)
CRU_INSTANTIATE(attn_exact, 2, 32, false)
CRU_INSTANTIATE(attn_exact, 1, 16, false)
CRU_INSTANTIATE(attn_exact, 4, 64, true)
CRU_INSTANTIATE(attn_online, 4, 64)
#endif
