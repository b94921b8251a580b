// attention_pv.cuh: attn_exact's PV pass over one staged V tile, in two forms: four
// distributions a thread where the CTA's come in fours (Q % 4 == 0, so nw = Q * G is a
// multiple of 4), else two chains a thread (common.cuh's cru_pv_slots).
//
// Why: with two chains a thread (cru_pv_slots) every position costs a thread one V read
// and a score read per two FMAs, plus a causal-length compare per chain; shared memory,
// not the FMA pipe, bounded the pass (Nsight Compute, single-1024: the PV loop issued 43%
// of the kernel's instructions and 52% of its shared-memory wavefronts, L1 82% busy).
// Here a thread owns one dimension of four distributions: one V read feeds four chains,
// a float4 of scores covers four positions of a distribution, and positions every valid
// row attends to (below row 0's causal length) run without compares. Each chain is still
// acc = fma(p_j, v_j[d], acc) over j ascending from 0, so the bits are the reference's.
//
// Thread mapping (quad form): thread t < 16 nw owns dimension t & 63 of distributions 4 (t >> 6) ..
// 4 (t >> 6) + 3; threads past 16 nw run no chain (they wait at the tile barriers).
// Layout: scores[dist * capacity + pos] (f32, 16-byte aligned rows), the staged V tile
// kv[(pos - base) * CRU_KV_STRIDE + dim].
#pragma once

#include "common.cuh"

struct PvQuad {
    int d0, dim, len[4];
    bool active;
};

__device__ __forceinline__ PvQuad cru_pv_quad(int nw, const int* lens) {
    PvQuad p;
    const int t = threadIdx.x;
    p.active = t < 16 * nw;
    p.d0 = (t >> 6) * 4;
    p.dim = t & 63;
#pragma unroll
    for (int i = 0; i < 4; ++i) p.len[i] = p.active ? lens[p.d0 + i] : 0;
    return p;
}

// One staged V tile, positions [base, base + n): chains acc[0..3] of distributions d0..d0+3.
// `lo` is the shortest valid causal length of the tile's rows (row 0's): below it no
// position needs a mask. A distribution of a row past the segment (len 0) runs the
// unmasked part on unwritten scores and is never stored.
__device__ __forceinline__ void cru_pv_quad_tile(const PvQuad& p, const float* kv,
                                                 const float* scores, int capacity, int base,
                                                 int n, int lo, float acc[4]) {
    if (!p.active) return;
    const float* s0 = scores + p.d0 * capacity + base;
    const float* vcol = kv + p.dim;
    const int full = max(0, min(n, lo - base)) & ~3;
    for (int jj = 0; jj < full; jj += 4) {
        float4 s[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] = *reinterpret_cast<const float4*>(s0 + i * capacity + jj);
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = vcol[(jj + u) * CRU_KV_STRIDE];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[i] = cru_pv(s[i].x, v[0], acc[i]);
            acc[i] = cru_pv(s[i].y, v[1], acc[i]);
            acc[i] = cru_pv(s[i].z, v[2], acc[i]);
            acc[i] = cru_pv(s[i].w, v[3], acc[i]);
        }
    }
    for (int jj = full; jj < n; ++jj) {  // the last rows' own positions: masked per chain
        const float v = vcol[jj * CRU_KV_STRIDE];
        const int pos = base + jj;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (pos < p.len[i]) acc[i] = cru_pv(s0[i * capacity + jj], v, acc[i]);
    }
}

// The two-chain form: one dimension of two distributions (or two of one), every position
// masked by each chain's causal length.
__device__ __forceinline__ void cru_pv_pair_tile(const PvSlots& p, const float* kv,
                                                 const float* sa, const float* sb, int base,
                                                 int n, int len_a, int len_b, float& acc_a,
                                                 float& acc_b) {
    for (int jj = 0; jj < n; jj += 4) {  // scores are 16B aligned: base, jj % 4 == 0
        const float4 pa = *reinterpret_cast<const float4*>(sa + base + jj);
        const float4 pb = *reinterpret_cast<const float4*>(sb + base + jj);
        const float pav[4] = {pa.x, pa.y, pa.z, pa.w}, pbv[4] = {pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int pos = base + jj + i;
            const float* vr = kv + (jj + i) * CRU_KV_STRIDE;
            if (pos < len_a) acc_a = cru_pv(pav[i], vr[p.dim_a], acc_a);
            if (pos < len_b) acc_b = cru_pv(pbv[i], vr[p.dim_b], acc_b);
        }
    }
}
