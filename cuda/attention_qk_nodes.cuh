// attention_qk_nodes.cuh: attn_exact's QK pass (attention.cu), node-parallel. Same scores,
// bit for bit, as cru_qk_tile (common.cuh), which the online family keeps.
//
// Layout: a staged K tile (cru_stage<KT, true>) and q_s hold each 64-float row in tree
// order, where floats 8 c .. 8 c + 7 ("chunk" c) are the eight dims of one level-2 subtree
// of the reference's xor-butterfly dot tree: chunk c pairs with c ^ 1 at level 3 (the warp's
// xor 4), then c ^ 2 (xor 2), then c ^ 4 (xor 1), as cru_tree_dots adds them.
//
// Thread mapping: the CTA's 32 nw threads form 4 nw lane octets. Octet o takes the DQ
// (CRU_QK_DQ = 2) distributions DQ g .. DQ g + DQ - 1 of group g = o % groups (groups =
// ceil(nw / DQ)) and the tile's keys o / groups, + stride, ... (stride = octets / groups);
// its lane c holds chunk c of those q rows in registers (loaded once, before the first
// tile) and, per key, chunk c of the key (two float4). Each lane evaluates its subtree for
// the DQ distributions, and xor shuffles over 1, 2 and 4 lanes add the levels above in the
// reference's order (fp add commutes, so both partners get the same sum); lane r stores
// distribution DQ g + r's score. cru_qk_tile instead gives each thread whole dot products,
// reading a K row and two q rows from shared memory per pair (three shared-memory
// wavefronts per distribution and key, against about one here). DQ = 2 keeps attn_exact
// at 48 registers (3 CTAs of 384 threads an SM, as before); 4 would take 64.
// The loop count is the same for every lane of the CTA (the shuffles take whole warps);
// keys past the tile and distributions past nw compute on stale values and store nothing.
#pragma once
#include "common.cuh"

#ifndef CRU_QK_DQ  // (a -D override times other widths)
#define CRU_QK_DQ 2  // distributions per octet (q chunks in 8 DQ registers)
#endif

struct QkNodes {
    float q[CRU_QK_DQ][8];  // chunk `lane` of distributions DQ group + r
    int group, key0, stride, lane;
    bool works;  // octets past groups * stride have no keys
};

__device__ __forceinline__ QkNodes cru_qk_nodes_setup(const float* q_s, int nw) {
    QkNodes n;
    const int octet = threadIdx.x >> 3, octets = blockDim.x >> 3;
    const int groups = (nw + CRU_QK_DQ - 1) / CRU_QK_DQ;
    n.lane = threadIdx.x & 7;
    n.group = octet % groups;
    n.key0 = octet / groups;
    n.stride = octets / groups;
    n.works = octet < groups * n.stride;
#pragma unroll
    for (int r = 0; r < CRU_QK_DQ; ++r) {
        const int dist = n.group * CRU_QK_DQ + r;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
        if (dist < nw) {
            a = *reinterpret_cast<const float4*>(q_s + dist * CRU_HEAD_DIM + 8 * n.lane);
            b = *reinterpret_cast<const float4*>(q_s + dist * CRU_HEAD_DIM + 8 * n.lane + 4);
        }
        n.q[r][0] = a.x; n.q[r][1] = a.y; n.q[r][2] = a.z; n.q[r][3] = a.w;
        n.q[r][4] = b.x; n.q[r][5] = b.y; n.q[r][6] = b.z; n.q[r][7] = b.w;
    }
    return n;
}

// Scores of one staged K tile (positions base .. base + KT - 1) for every distribution,
// stored at scores[dist * stride + pos].
template <int KT>
__device__ __forceinline__ void cru_qk_nodes(const float* kbuf, const QkNodes& n,
                                             const int* lens, float* scores, int stride,
                                             int base, int nw) {
    const int iters = (KT + n.stride - 1) / n.stride;
    // Lanes 4-7 load their chunk's halves in the other order, so an octet's eight float4
    // loads of a row fall in eight distinct bank groups.
    const int hi = n.lane >> 2;
    for (int it = 0; it < iters; ++it) {
        const int key = n.key0 + it * n.stride;
        const bool live = n.works && key < KT;
        const float* krow = kbuf + (live ? key : 0) * CRU_KV_STRIDE + 8 * n.lane;
        const float4 l0 = *reinterpret_cast<const float4*>(krow + 4 * hi);
        const float4 l1 = *reinterpret_cast<const float4*>(krow + 4 - 4 * hi);
        const float4 ka = hi ? l1 : l0, kb = hi ? l0 : l1;
        float s[CRU_QK_DQ];
#pragma unroll
        for (int r = 0; r < CRU_QK_DQ; ++r) {
            const float* q = n.q[r];
            const float p0 = cru_leaf(q[0], q[1], ka.x, ka.y);  // dims x, x+32
            const float p1 = cru_leaf(q[2], q[3], ka.z, ka.w);  // x+16
            const float p2 = cru_leaf(q[4], q[5], kb.x, kb.y);  // x+8
            const float p3 = cru_leaf(q[6], q[7], kb.z, kb.w);  // x+24
            s[r] = cru_add(cru_add(p0, p1), cru_add(p2, p3));
        }
#pragma unroll
        for (int off = 1; off < 8; off <<= 1) {
#pragma unroll
            for (int r = 0; r < CRU_QK_DQ; ++r)
                s[r] = cru_add(s[r], __shfl_xor_sync(0xffffffffu, s[r], off));
        }
        const int pos = base + key;
#pragma unroll
        for (int r = 0; r < CRU_QK_DQ; ++r) {
            const int dist = n.group * CRU_QK_DQ + r;
            if (live && n.lane == r && dist < nw && pos < lens[dist])
                scores[dist * stride + pos] = cru_scale(s[r]);
        }
    }
}
