// attention_prefetch.cuh: one thread's share of a K or V tile held in registers from its
// load to its store into shared memory, for attn_exact's prefetching instance
// (attn_exact_pf, attention.cu: attn_exact<4, 64, false> with PF). Its loop issues tile
// t + 1's loads right after tile t's store, and the loads are in
// flight through t's QK or PV work (and the K pass's last tile's loads of V tile 0 through
// the softmax); with the plain staging (cru_stage) every tile waits out its loads.
//
// Layout and thread mapping: as cru_stage (common.cuh): thread x copies dimensions
// 4 (x & 15) .. + 3 of rows (x >> 4) + 24 i of the tile, so with 384 threads (q4 tiles
// at group 3: the only CTA size this instance is launched with, variants.plan_launch)
// three float4 cover the 64 rows. The values and where they land are cru_stage's, so the
// staged tile, and every bit after it, is the same. No standard headers.
#pragma once
#include "common.cuh"

template <int KT>
struct CruTileRegs {
    static constexpr int ROWS = 24;  // rows one pass of 384 threads stages
    static constexpr int N = (KT + ROWS - 1) / ROWS;
    float4 v[N];

    __device__ __forceinline__ void load(const float* __restrict__ pool, const TileJob& t,
                                         int base, int n_layers, int layer, int kv_dim) {
        const int d = (threadIdx.x & 15) * 4, end = min(KT, t.lmax - base);
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int jj = (threadIdx.x >> 4) + ROWS * i;
            if (jj < end)
                v[i] = *reinterpret_cast<const float4*>(
                    pool + cru_pool_row(t.table, base + jj, n_layers, layer, kv_dim, t.kvh) + d);
        }
    }

    template <bool TREE>
    __device__ __forceinline__ void store(float* buf, const TileJob& t, int base) const {
        const int d = (threadIdx.x & 15) * 4, end = min(KT, t.lmax - base);
        const int s0 = cru_tree_slot(d), s1 = cru_tree_slot(d + 1), s2 = cru_tree_slot(d + 2),
                  s3 = cru_tree_slot(d + 3);
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int jj = (threadIdx.x >> 4) + ROWS * i;
            if (jj >= end) continue;
            float* row = buf + jj * CRU_KV_STRIDE;
            if (TREE) {
                row[s0] = v[i].x;
                row[s1] = v[i].y;
                row[s2] = v[i].z;
                row[s3] = v[i].w;
            } else {
                *reinterpret_cast<float4*>(row + d) = v[i];
            }
        }
    }
};
