// common.cuh: the arithmetic spelling every exact kernel shares.
//
// Why this file exists: "exact" means bit-identical, and bit identity only survives if every
// kernel spells each floating-point step the same way. The compiler is free to contract
// a*b+c into an FMA in one kernel and not in another, so every step of the canonical
// order goes through one of the explicit-rounding intrinsics below (__fmul_rn, __fadd_rn,
// __fmaf_rn, __frcp_rn), which nvcc/NVRTC may not fuse or reassociate.
//
// It also holds the building blocks both tiled families share (TileJob, K/V/q staging,
// tree-ordered dot products, PV ownership), so exact and online stage data identically.
//
// Layout facts shared by all kernels:
//   pool[page][layer][16][kv_dim] f32, kv_dim = n_kv_heads * 64, C-contiguous;
//   position p -> page_tables[table_index * table_stride + (p >> 4)], slot p & 15.
// No standard headers: NVRTC compiles this without a host toolchain.
#pragma once

#define CRU_HEAD_DIM 64
#define CRU_PAGE_SHIFT 4
#define CRU_PAGE_MASK 15
#define CRU_KV_STRIDE 68  // 64 + 4 floats: float4 loads of 8 rows hit 32 distinct banks
#define CRU_NEG_INF __int_as_float(0xff800000)

// One lane's contribution to a QK dot product in the canonical order: lane d owns
// dimensions d and d+32; it multiplies the low pair, then fuses the high pair onto it.
__device__ __forceinline__ float cru_leaf(float q_lo, float q_hi, float k_lo, float k_hi) {
    return __fmaf_rn(q_hi, k_hi, __fmul_rn(q_lo, k_lo));
}

__device__ __forceinline__ float cru_add(float a, float b) { return __fadd_rn(a, b); }

// The canonical QK scale, 1/sqrt(64); a power of two, applied after the dot tree.
__device__ __forceinline__ float cru_scale(float s) { return __fmul_rn(s, 0.125f); }

// exp(score - max) with the fast intrinsic, exactly as the reference spells it.
__device__ __forceinline__ float cru_exp_shifted(float s, float m) {
    return __expf(__fsub_rn(s, m));
}

// One PV step: acc += p * v, always fused, always ascending in history position.
__device__ __forceinline__ float cru_pv(float p, float v, float acc) { return __fmaf_rn(p, v, acc); }

__device__ __forceinline__ float cru_recip(float x) { return __frcp_rn(x); }

__device__ __forceinline__ float cru_warp_sum(float v) {
    // xor butterfly 16,8,4,2,1: every lane ends with the same bits (fp add commutes).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = cru_add(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float cru_warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// The reference's softmax over scores[0..len) for a 256-thread CTA (8 warps): max over a
// strided sweep, warp max, warp maxima in order; then exp(s - max) written back in place,
// summed by thread j over j, j + 256, ... ascending, xor-butterfly per warp, warp sums
// added in ascending order. Returns 1 / sum in every thread. `red` is 8 shared floats and
// `bcast` one; both are free again when this returns.
__device__ __forceinline__ float cru_ref_softmax(float* scores, int len, float* red,
                                                 float* bcast) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float m = CRU_NEG_INF;
    for (int j = tid; j < len; j += 256) m = fmaxf(m, scores[j]);
    m = cru_warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    if (tid == 0) {
        float t = red[0];
        for (int w = 1; w < 8; ++w) t = fmaxf(t, red[w]);
        *bcast = t;
    }
    __syncthreads();
    m = *bcast;
    float sum = 0.0f;
    for (int j = tid; j < len; j += 256) {
        const float e = cru_exp_shifted(scores[j], m);
        scores[j] = e;
        sum = cru_add(sum, e);
    }
    sum = cru_warp_sum(sum);
    __syncthreads();  // thread 0 finished reading red[] and everyone read bcast
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        float t = red[0];
        for (int w = 1; w < 8; ++w) t = cru_add(t, red[w]);
        *bcast = cru_recip(t);
    }
    __syncthreads();
    const float inv = *bcast;
    __syncthreads();  // everyone read bcast before a caller reuses it
    return inv;
}

// Reverse the low five bits. Visiting leaves in bit-reversed order is a depth-first walk
// of the xor butterfly above, which lets one thread replay a warp's dot tree alone.
__device__ __forceinline__ int cru_bitrev5(int i) { return (int)(__brev((unsigned)i) >> 27); }

// Where dimension d of a head row lands in the "tree order" staging layout: leaf i holds
// (dim bitrev5(i), dim bitrev5(i)+32) at floats 2i, 2i+1, so four consecutive leaves (one
// complete level-2 subtree) are two aligned float4 loads.
__device__ __forceinline__ int cru_tree_slot(int d) {
    return 2 * cru_bitrev5(d & 31) + (d >> 5);
}

// Flat float offset of (position, head column 0) in the pool for one request.
__device__ __forceinline__ long long cru_pool_row(const int* table, int pos, int n_layers,
                                                  int layer, int kv_dim, int kv_head) {
    const long long page = table[pos >> CRU_PAGE_SHIFT];
    return ((page * n_layers + layer) * 16 + (pos & CRU_PAGE_MASK)) * (long long)kv_dim +
           kv_head * CRU_HEAD_DIM;
}

// ------------------------------------------------------------------------------------
// Tile building blocks shared by attn_exact and attn_online (attention.cu).
// ------------------------------------------------------------------------------------
struct TileJob {
    int4 sd;          // segment descriptor
    int r0, n_rows;   // first row of the tile within the segment, valid rows (0 = none)
    int lmax;         // causal length of the tile's last valid row
    int kvh, group, nw;
    const int* table;
};

__device__ __forceinline__ TileJob cru_tile_job(const int4* segs, const int* tables,
                                                int table_stride, int n_heads, int n_kv_heads,
                                                int rows_per_tile) {
    TileJob t;
    t.sd = segs[blockIdx.z];
    // Longest tiles first: the last tile of a segment has the most history, so launching
    // it early keeps the tail of the grid short.
    t.r0 = (gridDim.y - 1 - blockIdx.y) * rows_per_tile;
    t.n_rows = max(0, min(rows_per_tile, t.sd.y - t.r0));
    t.lmax = t.sd.z + t.r0 + t.n_rows;
    t.kvh = blockIdx.x;
    t.group = n_heads / n_kv_heads;
    t.nw = rows_per_tile * t.group;
    t.table = tables + (long long)t.sd.w * table_stride;
    return t;
}

// Copy positions [base, base+KT) (clipped to lmax) of one KV head into smem rows of
// CRU_KV_STRIDE floats; TREE scatters dimensions into the dot tree's leaf order.
template <int KT, bool TREE>
__device__ __forceinline__ void cru_stage(float* buf, const float* __restrict__ pool,
                                          const TileJob& t, int base, int n_layers, int layer,
                                          int kv_dim) {
    // Blocks are whole warps (a multiple of 16 threads), so a thread always copies the same
    // four dimensions: their tree slots are worked out once, not per position.
    const int d = (threadIdx.x & 15) * 4;
    const int s0 = cru_tree_slot(d), s1 = cru_tree_slot(d + 1), s2 = cru_tree_slot(d + 2),
              s3 = cru_tree_slot(d + 3);
    const int end = min(KT, t.lmax - base);
    for (int jj = threadIdx.x >> 4; jj < end; jj += blockDim.x >> 4) {
        const float4 v = *reinterpret_cast<const float4*>(
            pool + cru_pool_row(t.table, base + jj, n_layers, layer, kv_dim, t.kvh) + d);
        float* row = buf + jj * CRU_KV_STRIDE;
        if (TREE) {
            row[s0] = v.x;
            row[s1] = v.y;
            row[s2] = v.z;
            row[s3] = v.w;
        } else {
            *reinterpret_cast<float4*>(row + d) = v;
        }
    }
}

// Stage each distribution's q row in tree order and publish its causal length (0 = idle).
__device__ __forceinline__ void cru_stage_q(float* q_s, int* lens, const float* __restrict__ q,
                                            const TileJob& t, int n_heads) {
    for (int u = threadIdx.x; u < t.nw * 16; u += blockDim.x) {
        const int dist = u >> 4, d = (u & 15) * 4, row = dist / t.group;
        if (row >= t.n_rows) continue;
        const int h = t.kvh * t.group + dist % t.group;
        const float4 v = *reinterpret_cast<const float4*>(
            q + ((long long)(t.sd.x + t.r0 + row) * n_heads + h) * CRU_HEAD_DIM + d);
        float* dst = q_s + dist * CRU_HEAD_DIM;
        dst[cru_tree_slot(d)] = v.x;
        dst[cru_tree_slot(d + 1)] = v.y;
        dst[cru_tree_slot(d + 2)] = v.z;
        dst[cru_tree_slot(d + 3)] = v.w;
    }
    if (threadIdx.x < t.nw) {
        const int row = threadIdx.x / t.group;
        lens[threadIdx.x] = row < t.n_rows ? t.sd.z + t.r0 + row + 1 : 0;
    }
}

// R scaled dot products of one staged K row against R tree-ordered q rows. Chunk c holds
// leaves 4c..4c+3 = one level-2 subtree; the final combination mirrors xor offsets 4,2,1.
template <int R>
__device__ __forceinline__ void cru_tree_dots(const float* krow, const float* q0, float* res) {
    float v2[R][8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        const float4 ka = *reinterpret_cast<const float4*>(krow + 8 * c);
        const float4 kb = *reinterpret_cast<const float4*>(krow + 8 * c + 4);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float4 qa = *reinterpret_cast<const float4*>(q0 + r * CRU_HEAD_DIM + 8 * c);
            const float4 qb = *reinterpret_cast<const float4*>(q0 + r * CRU_HEAD_DIM + 8 * c + 4);
            const float p0 = cru_leaf(qa.x, qa.y, ka.x, ka.y);  // dims x, x+32
            const float p1 = cru_leaf(qa.z, qa.w, ka.z, ka.w);  // x+16 (xor 16 partner)
            const float p2 = cru_leaf(qb.x, qb.y, kb.x, kb.y);  // x+8
            const float p3 = cru_leaf(qb.z, qb.w, kb.z, kb.w);  // x+24
            v2[r][c] = cru_add(cru_add(p0, p1), cru_add(p2, p3));
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float v4a = cru_add(cru_add(v2[r][0], v2[r][1]), cru_add(v2[r][2], v2[r][3]));
        const float v4b = cru_add(cru_add(v2[r][4], v2[r][5]), cru_add(v2[r][6], v2[r][7]));
        res[r] = cru_scale(cru_add(v4a, v4b));
    }
}

// Scores of one staged K tile for every distribution; score (dist, pos) is stored at
// scores[dist*stride + pos - shift]. Pairs of distributions share each K row read.
template <int KT>
__device__ __forceinline__ void cru_qk_tile(const float* kbuf, const float* q_s, const int* lens,
                                            float* scores, int stride, int shift, int base,
                                            int nw) {
    if (KT >= 64 && (nw & 1) == 0) {
        for (int u = threadIdx.x; u < (nw >> 1) * KT; u += blockDim.x) {
            const int d0 = (u / KT) * 2, pos = base + u % KT;
            if (pos >= lens[d0] && pos >= lens[d0 + 1]) continue;
            float s[2];
            cru_tree_dots<2>(kbuf + (u % KT) * CRU_KV_STRIDE, q_s + d0 * CRU_HEAD_DIM, s);
            if (pos < lens[d0]) scores[d0 * stride + pos - shift] = s[0];
            if (pos < lens[d0 + 1]) scores[(d0 + 1) * stride + pos - shift] = s[1];
        }
    } else {
        for (int u = threadIdx.x; u < nw * KT; u += blockDim.x) {
            const int d0 = u / KT, pos = base + u % KT;
            if (pos >= lens[d0]) continue;
            float s[1];
            cru_tree_dots<1>(kbuf + (u % KT) * CRU_KV_STRIDE, q_s + d0 * CRU_HEAD_DIM, s);
            scores[d0 * stride + pos - shift] = s[0];
        }
    }
}

// PV ownership: with an even number of distributions a thread owns one dimension of two
// distributions (one V read feeds two chains); otherwise two dimensions of one.
struct PvSlots {
    int da, db, dim_a, dim_b;
};

__device__ __forceinline__ PvSlots cru_pv_slots(int nw) {
    PvSlots p;
    const int tid = threadIdx.x;
    if ((nw & 1) == 0) {
        p.da = (tid >> 6) * 2; p.db = p.da + 1; p.dim_a = p.dim_b = tid & 63;
    } else {
        p.da = p.db = tid >> 5; p.dim_a = tid & 31; p.dim_b = (tid & 31) + 32;
    }
    return p;
}

__device__ __forceinline__ void cru_store_out(float* __restrict__ out, const TileJob& t,
                                              int n_heads, int dist, int dim, float value) {
    const int row = dist / t.group, h = t.kvh * t.group + dist % t.group;
    out[((long long)(t.sd.x + t.r0 + row) * n_heads + h) * CRU_HEAD_DIM + dim] = value;
}
