// common.cuh: the arithmetic spelling every exact kernel shares.
//
// Why this file exists: "exact" means bit-identical, and bit identity only survives if every
// kernel spells each floating-point step the same way. The compiler is free to contract
// a*b+c into an FMA in one kernel and not in another, so every step of the canonical
// order goes through one of the explicit-rounding intrinsics below (__fmul_rn, __fadd_rn,
// __fmaf_rn, __frcp_rn), which nvcc/NVRTC may not fuse or reassociate.
//
// Layout facts shared by all kernels:
//   pool[page][layer][16][kv_dim] f32, kv_dim = n_kv_heads * 64, C-contiguous;
//   position p -> page_tables[table_index * table_stride + (p >> 4)], slot p & 15.
// No standard headers: NVRTC compiles this without a host toolchain.
#pragma once

#define CRU_HEAD_DIM 64
#define CRU_PAGE_SHIFT 4
#define CRU_PAGE_MASK 15

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
