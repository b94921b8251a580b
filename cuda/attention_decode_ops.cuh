// attention_decode_ops.cuh: the pieces of attn_decode (attention_decode.cu), whose header
// states the layout and thread mapping: V tile staging, L2 prefetch, key loads, the G
// heads' reference dot trees, and the PV chains. Each piece replays the reference kernel's
// arithmetic (attention.cu) in its order. No standard headers (NVRTC).
#pragma once
#include "common.cuh"
#include "rowops.cuh"

#define CRU_DEC_VT 128  // V positions per staged tile

// The 8 float4 of V tile `base` this thread stages: positions base + 16 i + tid / 16 (i < 8),
// those in [lo, hi) only (the others keep what r holds), columns 4 (tid & 15) .. + 3. base is
// a multiple of 16, so the 8 positions are one slot of 8 consecutive pages: one in-page
// offset serves all of them (cru_pool_row's address, factored) and each page-table read is
// a broadcast.
__device__ __forceinline__ void cru_dec_load_v(float4* r, const float* v_pool, const int* tab,
                                               int base, int lo, int hi, int n_layers,
                                               int layer, int kv_dim, int kvh) {
    int slot = threadIdx.x >> 4;
    // Opaque, so each call rebuilds `col`: kept live from one call to the next (through QK)
    // it would cost G = 1 two of its last registers.
    asm volatile("" : "+r"(slot));
    const float* col = v_pool + ((long long)(layer * 16 + slot) * kv_dim + kvh * CRU_HEAD_DIM +
                                 (threadIdx.x & 15) * 4);
    const long long page_floats = (long long)n_layers * 16 * kv_dim;
#pragma unroll
    for (int i = 0; i < CRU_DEC_VT / 16; ++i) {
        const int pos = base + 16 * i + slot;
        if (pos >= lo && pos < hi)
            r[i] = *reinterpret_cast<const float4*>(col + tab[(base >> 4) + i] * page_floats);
    }
}

// Ask L2 for position `pos`'s 256 bytes (two lines) without holding registers for them.
__device__ __forceinline__ void cru_dec_prefetch(const float* pool, const int* tab, int pos,
                                                 int n_layers, int layer, int kv_dim, int kvh) {
#ifndef CRU_HOST_SHIM  // tests/cuda_host: no cache to ask (a prefetch changes no value)
    const float* p = pool + cru_pool_row(tab, pos, n_layers, layer, kv_dim, kvh);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 32));
#endif
}

// Where q dimension d is staged: "octet order", slot 8 * (d & 7) + (d >> 3), so that the
// eight dimensions i, i + 8, ..., i + 56 that level-2 node i of the dot tree needs are two
// float4 (slots 8 i .. 8 i + 7).
__device__ __forceinline__ int cru_dec_q_slot(int d) { return 8 * (d & 7) + (d >> 3); }

// The 8 floats of key `pos` that node `node` of the tree needs: dims node + 8 m, m < 8. The
// 8 threads of a key read its 256 bytes together, 32 contiguous bytes (one sector) per load.
__device__ __forceinline__ void cru_dec_load_knode(float (&k)[8], const float* k_pool,
                                                   const int* tab, int pos, int node,
                                                   int n_layers, int layer, int kv_dim,
                                                   int kvh) {
    const float* kr = k_pool + cru_pool_row(tab, pos, n_layers, layer, kv_dim, kvh) + node;
#pragma unroll
    for (int m = 0; m < 8; ++m) k[m] = kr[8 * m];
}

// The G heads' scaled dot products with one key, node-parallel: the 8 threads of an aligned
// lane octet hold one key, thread `node` (= lane & 7) the key's and each head's dims
// node + 8 m. The reference tree (the warp's xor butterfly, attention.cu) is level-2 node i
// = (leaf(i) + leaf(i + 16)) + (leaf(i + 8) + leaf(i + 24)), leaf(x) = q[x+32]*k[x+32] fused
// onto q[x]*k[x]; then nodes i and i + 4, then 0+2 and 1+3, then the root. Each thread
// evaluates its own node, and xor shuffles over 4, 2, 1 build the upper levels (fp add
// commutes, so both partners of a shuffle get the same sum): every lane of the octet ends
// with the root. All 32 lanes must call this (the shuffles are warp-wide).
template <int G>
__device__ __forceinline__ void cru_dec_node_dots(const float (&k)[8], const float (&q)[G][8],
                                                  float (&s)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float l0 = cru_leaf(q[g][0], q[g][4], k[0], k[4]);    // dims i, i + 32
        const float l8 = cru_leaf(q[g][1], q[g][5], k[1], k[5]);    // i + 8, i + 40
        const float l16 = cru_leaf(q[g][2], q[g][6], k[2], k[6]);   // i + 16, i + 48
        const float l24 = cru_leaf(q[g][3], q[g][7], k[3], k[7]);   // i + 24, i + 56
        s[g] = cru_add(cru_add(l0, l16), cru_add(l8, l24));
    }
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = cru_add(s[g], __shfl_xor_sync(0xffffffffu, s[g], off));
    }
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = cru_scale(s[g]);
}

// Four steps of the G chains: acc[g] += p[g].{x,y,z,w} * v[0..3], in that order.
template <int G>
__device__ __forceinline__ void cru_dec_pv4(const float4 (&p)[G], const float (&v)[4],
                                            float (&acc)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        acc[g] = cru_pv(p[g].x, v[0], acc[g]);
        acc[g] = cru_pv(p[g].y, v[1], acc[g]);
        acc[g] = cru_pv(p[g].z, v[2], acc[g]);
        acc[g] = cru_pv(p[g].w, v[3], acc[g]);
    }
}

// Step s's operands: each head's four probabilities (one float4) and v[s..s+3][d].
template <int G>
__device__ __forceinline__ void cru_dec_load4(const float* vt, const float* sc, int stride,
                                              int s, int d, float4 (&p)[G], float (&v)[4]) {
#pragma unroll
    for (int g = 0; g < G; ++g) p[g] = *reinterpret_cast<const float4*>(sc + g * stride + s);
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = vt[(s + u) * CRU_HEAD_DIM + d];
}

// Chains of dimension d over n staged positions: acc[g] += p[g][s] * v[s][d], s ascending
// (sc = head 0's probabilities of the tile; head g's are stride floats further). Four
// positions per step so each head's probabilities are one float4 (sc is 16-byte aligned:
// tiles start at multiples of 128 and stride is a multiple of 256); each step's loads are
// issued before the previous step's fmas, so shared-memory latency overlaps the chains.
template <int G>
__device__ __forceinline__ void cru_dec_pv_tile(const float* vt, const float* sc, int stride,
                                                int n, int d, float (&acc)[G]) {
    const int n4 = n & ~3;
    if (n4 > 0) {
        float4 p[G];
        float v[4];
        cru_dec_load4<G>(vt, sc, stride, 0, d, p, v);
#pragma unroll 2
        for (int s = 4; s < n4; s += 4) {
            float4 pc[G];  // copies the compiler renames away
            float vc[4];
#pragma unroll
            for (int g = 0; g < G; ++g) pc[g] = p[g];
#pragma unroll
            for (int u = 0; u < 4; ++u) vc[u] = v[u];
            cru_dec_load4<G>(vt, sc, stride, s, d, p, v);
            cru_dec_pv4<G>(pc, vc, acc);
        }
        cru_dec_pv4<G>(p, v, acc);
    }
    for (int s = n4; s < n; ++s) {
        const float v = vt[s * CRU_HEAD_DIM + d];
#pragma unroll
        for (int g = 0; g < G; ++g) acc[g] = cru_pv(sc[g * stride + s], v, acc[g]);
    }
}

// Position len - 1's K node (dims node + 8 m) from the RoPE-in copy in shared memory.
__device__ __forceinline__ void cru_dec_knode_smem(float (&k)[8], const float* k_new, int node) {
#pragma unroll
    for (int m = 0; m < 8; ++m) k[m] = k_new[node + 8 * m];
}

// RoPE in (attn_decode<G, 0, false, true>): rope_store's work for one CTA's heads of one row
// (model_ops.cu, the same cru_rope on the same table entries). raw: the row's QKV (query
// heads, then K heads, then V heads); c, s: the row's position's cos/sin (32 each). Warps
// 0..G-1 rotate query head head0 + warp into q_s (octet order); warp G rotates the K head
// into k_pool_row and k_new; warps G+1 and G+2 copy the V head into v_pool_row and v_new.
template <int G>
__device__ __forceinline__ void cru_dec_rope_in(const float* raw, int n_heads, int kv_dim,
                                                int head0, int kvh, const float* c,
                                                const float* s,
                                                float (*q_s)[CRU_HEAD_DIM],
                                                float* k_pool_row, float* v_pool_row,
                                                float* k_new, float* v_new, int tid) {
    const int warp = tid >> 5, j = tid & 31, q_dim = n_heads * CRU_HEAD_DIM;
    if (warp < G) {
        const float* v = raw + (head0 + warp) * CRU_HEAD_DIM;
        const float2 r = cru_rope(v[j], v[j + 32], c[j], s[j]);
        q_s[warp][cru_dec_q_slot(j)] = r.x;
        q_s[warp][cru_dec_q_slot(j + 32)] = r.y;
    } else if (warp == G) {
        const float* v = raw + q_dim + kvh * CRU_HEAD_DIM;
        const float2 r = cru_rope(v[j], v[j + 32], c[j], s[j]);
        k_new[j] = r.x;
        k_new[j + 32] = r.y;
        k_pool_row[j] = r.x;
        k_pool_row[j + 32] = r.y;
    } else if (warp <= G + 2) {
        const int d = tid - 32 * (G + 1);
        const float x = raw[q_dim + kv_dim + kvh * CRU_HEAD_DIM + d];
        v_new[d] = x;
        v_pool_row[d] = x;
    }
}
