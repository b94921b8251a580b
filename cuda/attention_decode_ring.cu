// attention_decode_ring.cu: paged attention for decode steps of many rows, bit-identical to
// attn_decode (attention_decode.cu) and so to attn_reference, with K and V streamed through
// a ring of shared-memory chunks by cp.async instead of loaded into registers.
//
// Why: attn_decode<G> gives each thread one key's 64 floats straight from global memory, so
// each of a warp's 16 float4 loads touches 32 different 128-byte lines; the L1 then spends
// 16 tag lookups per key and the V tiles queue behind them. On the H200 (Nsight Compute and
// per-CTA clocks at 256 rows of 400-1,200 positions) a CTA spent ~40 cycles per position
// in QK and ~30 in PV and streamed ~14 bytes/ns whatever the load, the L1 was 77% busy and
// DRAM 58%. Here every copy is coalesced (16 threads per 256-byte row: 4 lines a warp
// instruction) and S chunks are in flight while one is computed.
//
// Layout: as attention_decode.cu (q/out [T, n_heads*64]; k/v pool [pages][n_layers][16]
// [kv_dim]; segs int4 (packed_start, chunk_len, absolute_start, table_index); tables).
// Thread mapping: grid (n_heads / G, S_rows), 256 threads; one CTA per (KV head's G query
// heads, one-row segment), as attn_decode<G>. The row's history is cut into chunks of 128
// positions; chunk c < nK is K of positions [128c, 128c + 128), chunk nK + t is V tile t.
// Chunk c lives in ring slot c % S (S * 32 KB); chunk c + S is issued once c is consumed.
//   - K chunk: row j (position 128c + j) holds its 16 float4 at slots f ^ ((j & 3) << 1),
//     so the loads below are free of bank conflicts. Threads 2j and 2j + 1 score key j:
//     half h takes float4s 2m + h (m < 8), exactly the dimensions of the reference dot
//     tree's level-2 nodes 4h .. 4h + 3 (node i: dims i + 8m); each half builds its four
//     nodes for the G heads as cru_dec_dots does, the halves swap them (shfl xor 1) and
//     both finish the tree (c_i = node_i + node_{i+4}, fp add commutes; then (c0 + c2) +
//     (c1 + c3)); the even thread stores the score.
//   - softmax: cru_ref_softmax_g over the G score vectors, once every K chunk is scored
//     (the first V chunks are in flight meanwhile).
//   - V tile: row s, 64 floats, unpadded; thread d < 64 runs the reference's ascending
//     fused chain of output dimension d for the G heads (cru_ring_pv), while threads
//     64..255 issue the copies of the chunks ahead (threads 0..63 issue none of V's).
// q is staged per head in "octet order" split by half (q_s[g][h][8 i + e] = dim 8 e + 4 h
// + i), 4 floats apart between halves so both halves' loads of one instruction hit
// distinct banks.
// PDL: the page table is staged before cru_pdl_wait; every K/V copy and q follow it.
// Dynamic shared memory: 4 * (S * 128 * 64 + G * capacity + capacity / 16) bytes.
// prefetch_len, w_o, o_parts and o_n are attn_decode's arguments, unused here (one
// argument list for both kernels: kernels/attention.py decode_args). No standard headers.
#include "attention_decode_ops.cuh"
#include "common.cuh"
#include "pdl.cuh"
#include "softmax_group.cuh"

#define CRU_RING_CHUNK 128  // positions per chunk (== CRU_DEC_VT, the V tile)

__device__ __forceinline__ void cru_ring_cp16(float* dst, const float* src) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
}
__device__ __forceinline__ void cru_ring_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cru_ring_wait() {  // all but the N newest groups landed
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Issue K chunk c's copies into `slot`, by all 256 threads (every thread scores keys): row
// (tid >> 4) + 16 i, float4 tid & 15, so a warp copies two whole 256-byte rows. A row's
// in-page slot and swizzle are the thread's own constants (chunks start at multiples of
// 128), so a copy costs one page-table read and one multiply-add.
__device__ __forceinline__ void cru_ring_issue_k(float* slot, int c, int len, const float* k_pool,
                                                 const int* tab, int n_layers, int layer,
                                                 int kv_dim, int kvh) {
    const int r = threadIdx.x >> 4, f = threadIdx.x & 15, base = c * CRU_RING_CHUNK;
    const float* col = k_pool + ((long long)(layer * 16 + r) * kv_dim + kvh * CRU_HEAD_DIM + 4 * f);
    const long long page_floats = (long long)n_layers * 16 * kv_dim;
    float* dst = slot + r * CRU_HEAD_DIM + 4 * (f ^ ((r & 3) << 1));
#pragma unroll
    for (int i = 0; i < CRU_RING_CHUNK / 16; ++i)
        if (base + r + 16 * i < len)
            cru_ring_cp16(dst + 16 * i * CRU_HEAD_DIM, col + tab[(base >> 4) + i] * page_floats);
}

// Issue V tile t's copies into `slot`, by threads 64..255 only: threads 0..63 run the PV
// chains meanwhile and issue nothing. Rows unswizzled (the chains read row s, column d).
__device__ __forceinline__ void cru_ring_issue_v(float* slot, int t, int len, const float* v_pool,
                                                 const int* tab, int n_layers, int layer,
                                                 int kv_dim, int kvh) {
    if (threadIdx.x < CRU_HEAD_DIM) return;
    const int base = t * CRU_RING_CHUNK;
    const long long page_floats = (long long)n_layers * 16 * kv_dim;
    const float* col = v_pool + ((long long)layer * 16 * kv_dim + kvh * CRU_HEAD_DIM);
    for (int g = threadIdx.x - CRU_HEAD_DIM; g < CRU_RING_CHUNK * 16; g += 256 - CRU_HEAD_DIM) {
        const int j = g >> 4, f = g & 15, pos = base + j;
        if (pos < len)
            cru_ring_cp16(slot + j * CRU_HEAD_DIM + 4 * f,
                          col + tab[pos >> 4] * page_floats + (pos & 15) * kv_dim + 4 * f);
    }
}

// Chunk c of the sequence (K chunks, then V tiles) into `slot`; nothing past the last.
__device__ __forceinline__ void cru_ring_issue(float* slot, int c, int nK, int len,
                                               const float* k_pool, const float* v_pool,
                                               const int* tab, int n_layers, int layer,
                                               int kv_dim, int kvh) {
    if (c < nK)
        cru_ring_issue_k(slot, c, len, k_pool, tab, n_layers, layer, kv_dim, kvh);
    else if (c < 2 * nK)
        cru_ring_issue_v(slot, c - nK, len, v_pool, tab, n_layers, layer, kv_dim, kvh);
}

// The G scores of key j of a K chunk, from half h of its dimensions (see the header). Every
// lane calls it (the swap is a full-warp shuffle); lanes past the history compute on
// whatever the slot holds and store nothing.
template <int G>
__device__ __forceinline__ void cru_ring_score(const float* kc, const float (*q_s)[2][36],
                                               int j, int h, float (&s)[G]) {
    const int sw = (j & 3) << 1;
    float4 kf[8];
#pragma unroll
    for (int m = 0; m < 8; ++m)
        kf[m] = *reinterpret_cast<const float4*>(kc + j * CRU_HEAD_DIM + 4 * ((2 * m + h) ^ sw));
    float b[G][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float k0 = (&kf[0].x)[i], k1 = (&kf[1].x)[i], k2 = (&kf[2].x)[i];
        const float k3 = (&kf[3].x)[i], k4 = (&kf[4].x)[i], k5 = (&kf[5].x)[i];
        const float k6 = (&kf[6].x)[i], k7 = (&kf[7].x)[i];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            // lo: q dims n, n + 8, n + 16, n + 24 of node n = 4h + i; hi: the same + 32
            const float4 lo = *reinterpret_cast<const float4*>(&q_s[g][h][8 * i]);
            const float4 hi = *reinterpret_cast<const float4*>(&q_s[g][h][8 * i + 4]);
            const float l0 = cru_leaf(lo.x, hi.x, k0, k4);
            const float l8 = cru_leaf(lo.y, hi.y, k1, k5);
            const float l16 = cru_leaf(lo.z, hi.z, k2, k6);
            const float l24 = cru_leaf(lo.w, hi.w, k3, k7);
            b[g][i] = cru_add(cru_add(l0, l16), cru_add(l8, l24));
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float c[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            c[i] = cru_add(b[g][i], __shfl_xor_sync(0xffffffffu, b[g][i], 1));
        s[g] = cru_scale(cru_add(cru_add(c[0], c[2]), cru_add(c[1], c[3])));
    }
}

// The PV chains of dimension d over n staged positions of a V tile: acc[g] += p[g][s] *
// v[s][d], s ascending (cru_pv, the reference's step). Eight positions a step; the next
// step's shared loads are issued before this step's fmas, so their latency hides behind
// 8 dependent steps of every chain instead of 4 (only two warps run the chains).
template <int G>
__device__ __forceinline__ void cru_ring_load8(const float* vt, const float* sc, int stride,
                                               int s, int d, float4 (&p)[2][G], float (&v)[8]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        p[0][g] = *reinterpret_cast<const float4*>(sc + g * stride + s);
        p[1][g] = *reinterpret_cast<const float4*>(sc + g * stride + s + 4);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = vt[(s + u) * CRU_HEAD_DIM + d];
}

template <int G>
__device__ __forceinline__ void cru_ring_pv(const float* vt, const float* sc, int stride, int n,
                                            int d, float (&acc)[G]) {
    const int n8 = n & ~7;
    if (n8 > 0) {
        float4 p[2][G];
        float v[8];
        cru_ring_load8<G>(vt, sc, stride, 0, d, p, v);
        for (int s = 8;; s += 8) {
            float4 pc[2][G];  // copies the compiler renames away
            float vc[8];
#pragma unroll
            for (int g = 0; g < G; ++g) {
                pc[0][g] = p[0][g];
                pc[1][g] = p[1][g];
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) vc[u] = v[u];
            if (s < n8) cru_ring_load8<G>(vt, sc, stride, s, d, p, v);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                acc[g] = cru_pv(pc[0][g].x, vc[0], acc[g]);
                acc[g] = cru_pv(pc[0][g].y, vc[1], acc[g]);
                acc[g] = cru_pv(pc[0][g].z, vc[2], acc[g]);
                acc[g] = cru_pv(pc[0][g].w, vc[3], acc[g]);
                acc[g] = cru_pv(pc[1][g].x, vc[4], acc[g]);
                acc[g] = cru_pv(pc[1][g].y, vc[5], acc[g]);
                acc[g] = cru_pv(pc[1][g].z, vc[6], acc[g]);
                acc[g] = cru_pv(pc[1][g].w, vc[7], acc[g]);
            }
            if (s >= n8) break;
        }
    }
    for (int s = n8; s < n; ++s) {
        const float v = vt[s * CRU_HEAD_DIM + d];
#pragma unroll
        for (int g = 0; g < G; ++g) acc[g] = cru_pv(sc[g * stride + s], v, acc[g]);
    }
}

template <int G, int S>
__global__ void __launch_bounds__(256, 2)
attn_decode_ring(const float* __restrict__ q, const float* __restrict__ k_pool,
                 const float* __restrict__ v_pool, const int4* __restrict__ segs, int n_segs,
                 const int* __restrict__ tables, int table_stride, float* __restrict__ out,
                 int n_heads, int n_kv_heads, int n_layers, int layer, int capacity,
                 int prefetch_len, const void* __restrict__ w_o, float* __restrict__ o_parts,
                 int o_n) {
    static_assert(G >= 1 && G <= 4 && S >= 2 && S <= 4, "instantiated for G 1..4, S 2..4");
    extern __shared__ float4 ring_smem4[];
    float* ring = reinterpret_cast<float*>(ring_smem4);               // [S][128][64]
    float* scores = ring + S * CRU_RING_CHUNK * CRU_HEAD_DIM;         // [G][capacity]
    int* tab = reinterpret_cast<int*>(scores + G * capacity);         // [capacity / 16]
    __shared__ __align__(16) float q_s[G][2][36];
    __shared__ CruSoftmaxScratch<G> sm;
    const int head0 = blockIdx.x * G, row = blockIdx.y, tid = threadIdx.x;
    if (row >= n_segs) return;
    const int4 sd = segs[row];
    if (sd.y == 0) return;  // an empty entry of a mixed-step graph's one-row list
    const long long prow = sd.x;
    const int len = sd.z + 1, nK = (len + CRU_RING_CHUNK - 1) / CRU_RING_CHUNK;
    const int kvh = head0 / (n_heads / n_kv_heads), kv_dim = n_kv_heads * CRU_HEAD_DIM;
    const int* table = tables + (long long)sd.w * table_stride;
    for (int i = tid; i < (len + 15) >> 4; i += 256) tab[i] = table[i];
    __syncthreads();
    cru_pdl_wait();
    cru_pdl_trigger();
#pragma unroll
    for (int c = 0; c < S - 1; ++c) {
        cru_ring_issue(ring + c * CRU_RING_CHUNK * CRU_HEAD_DIM, c, nK, len, k_pool, v_pool,
                       tab, n_layers, layer, kv_dim, kvh);
        cru_ring_commit();
    }
    if (tid < G * CRU_HEAD_DIM) {
        const int d = tid & 63, n = d & 7;  // octet slot 8 n + (d >> 3), split by half
        q_s[tid >> 6][n >> 2][8 * (n & 3) + (d >> 3)] =
            q[(prow * n_heads + head0) * CRU_HEAD_DIM + tid];
    }
    const int d = tid & 63;  // the output dimension this thread's chains own, if tid < 64
    float acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
    for (int c = 0; c < 2 * nK; ++c) {
        // Keep S - 1 chunks in flight: issue c + S - 1 into the slot chunk c - 1 freed.
        cru_ring_issue(ring + ((c + S - 1) % S) * CRU_RING_CHUNK * CRU_HEAD_DIM, c + S - 1,
                       nK, len, k_pool, v_pool, tab, n_layers, layer, kv_dim, kvh);
        cru_ring_commit();
        cru_ring_wait<S - 1>();  // this thread's copies of chunk c have landed
        __syncthreads();         // everyone's have (and, the first time, q_s)
        const float* chunk = ring + (c % S) * CRU_RING_CHUNK * CRU_HEAD_DIM;
        if (c < nK) {
            const int j = tid >> 1, pos = c * CRU_RING_CHUNK + j;
            float s[G];
            cru_ring_score<G>(chunk, q_s, j, tid & 1, s);
            if ((tid & 1) == 0 && pos < len) {
#pragma unroll
                for (int g = 0; g < G; ++g) scores[g * capacity + pos] = s[g];
            }
        } else {
            const int base = (c - nK) * CRU_RING_CHUNK;
            // The scores are complete (the barrier above); the softmax's own barriers
            // publish its exp values before any chain reads them.
            if (c == nK) cru_ref_softmax_g<G>(scores, capacity, len, sm);
            if (tid < CRU_HEAD_DIM)
                cru_ring_pv<G>(chunk, scores + base, capacity, min(CRU_RING_CHUNK, len - base),
                               d, acc);
        }
        __syncthreads();  // slot c % S is free for chunk c + S
    }
    if (tid < CRU_HEAD_DIM) {
#pragma unroll
        for (int g = 0; g < G; ++g)
            out[(prow * n_heads + head0 + g) * CRU_HEAD_DIM + d] = __fmul_rn(acc[g], sm.inv[g]);
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate what the host launches, so `-Xptxas -v` reports it.
#define CRU_RING_INSTANTIATE(G, S)                                                           \
    template __global__ void attn_decode_ring<G, S>(                                         \
        const float*, const float*, const float*, const int4*, int, const int*, int, float*, \
        int, int, int, int, int, int, const void*, float*, int);
CRU_RING_INSTANTIATE(3, 2)
CRU_RING_INSTANTIATE(3, 3)
#endif
