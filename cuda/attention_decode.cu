// attention_decode.cu: paged attention for decode steps (every segment is one row),
// bit-identical to attn_reference (attention.cu) but with the memory parallelism a single
// query row needs.
//
// Layout: as attention.cu. q/out [T, n_heads*64]; k/v pool [pages][n_layers][16][kv_dim];
// segs int4[S] = (packed_start, chunk_len, absolute_start, table_index); tables
// int32[S][table_stride]. Query head h reads KV head h / (n_heads / n_kv_heads).
//
// Thread mapping: grid (n_heads, T), 256 threads, one CTA per (query head, row), like the
// reference. What changes is who computes what, never the arithmetic:
//   - page-table entries of the row's history are staged in shared memory once;
//   - QK: thread j computes key j's score alone (256 keys per sweep), loading the key's 64
//     floats as 16 float4 and replaying the reference warp's xor-butterfly dot tree
//     sequentially (level 1 pairs lanes i and i + 16, then + 8, + 4, + 2, + 1; fp add
//     commutes, so lane 0's butterfly value is exactly this tree);
//   - softmax: cru_ref_softmax (common.cuh), the reference's own code;
//   - PV: threads 0..63 run the reference's ascending fused chain, one output dimension
//     each, over V tiles of 128 positions staged in shared memory by all 256 threads; the
//     next tile's loads are in flight (registers) while the chain consumes the current one.
// PDL (pdl.cuh): before cru_pdl_wait, the page table and the first V tile load and the keys
// are prefetched into L2, all except position len - 1, whose K/V the step's QKV kernel
// writes just before this one; q and that position load after it.
// Dynamic shared memory: 4 * (capacity + 128*64 + capacity/16). No standard headers (NVRTC).
#include "common.cuh"
#include "pdl.cuh"

#define CRU_DEC_VT 128  // V positions per staged tile

// The 8 float4 of V tile `base` this thread stages: positions base + (i*256 + tid) / 16,
// those in [lo, hi) only (the others keep what r holds).
__device__ __forceinline__ void cru_dec_load_v(float4* r, const float* v_pool, const int* tab,
                                               int base, int lo, int hi, int n_layers,
                                               int layer, int kv_dim, int kvh) {
#pragma unroll
    for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) {
        const int idx = i * 256 + threadIdx.x, pos = base + (idx >> 4);
        if (pos >= lo && pos < hi)
            r[i] = reinterpret_cast<const float4*>(
                v_pool + cru_pool_row(tab, pos, n_layers, layer, kv_dim, kvh))[idx & 15];
    }
}

// Ask L2 for key `pos`'s 256 bytes (two lines) without holding registers for them.
__device__ __forceinline__ void cru_dec_prefetch_k(const float* k_pool, const int* tab, int pos,
                                                   int n_layers, int layer, int kv_dim,
                                                   int kvh) {
    const float* p = k_pool + cru_pool_row(tab, pos, n_layers, layer, kv_dim, kvh);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 32));
}

__global__ void __launch_bounds__(256, 2)
attn_decode(const float* __restrict__ q, const float* __restrict__ k_pool,
            const float* __restrict__ v_pool, const int4* __restrict__ segs, int n_segs,
            const int* __restrict__ tables, int table_stride, float* __restrict__ out,
            int n_heads, int n_kv_heads, int n_layers, int layer, int capacity) {
    extern __shared__ float4 dec_smem4[];
    float* vt = reinterpret_cast<float*>(dec_smem4);  // [CRU_DEC_VT][64]
    float* scores = vt + CRU_DEC_VT * CRU_HEAD_DIM;    // [capacity]
    int* tab = reinterpret_cast<int*>(scores + capacity);  // [capacity / 16]
    __shared__ float q_s[CRU_HEAD_DIM];
    __shared__ float red[8];
    __shared__ float bcast;
    const int head = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
    if (row >= n_segs) return;
    const int4 sd = segs[row];  // decode: segment `row` is row `row` (one row each)
    const int len = sd.z + 1;
    const int kvh = head / (n_heads / n_kv_heads), kv_dim = n_kv_heads * CRU_HEAD_DIM;
    const int* table = tables + (long long)sd.w * table_stride;
    for (int i = tid; i < (len + 15) >> 4; i += 256) tab[i] = table[i];
    __syncthreads();

    // Before the wait: history only (positions < len - 1; see the header).
    const int hist = len - 1;
    float4 vr[CRU_DEC_VT * 16 / 256];
#pragma unroll
    for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) vr[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    cru_dec_load_v(vr, v_pool, tab, 0, 0, hist, n_layers, layer, kv_dim, kvh);
    for (int j = tid; j < hist; j += 256)
        cru_dec_prefetch_k(k_pool, tab, j, n_layers, layer, kv_dim, kvh);
    cru_pdl_wait();
    cru_pdl_trigger();
    if (tid < CRU_HEAD_DIM) q_s[tid] = q[((long long)row * n_heads + head) * CRU_HEAD_DIM + tid];
    cru_dec_load_v(vr, v_pool, tab, 0, hist, len, n_layers, layer, kv_dim, kvh);
    __syncthreads();

    for (int j = tid; j < len; j += 256) {  // the V tile's loads are in flight meanwhile
        const float4* kr = reinterpret_cast<const float4*>(
            k_pool + cru_pool_row(tab, j, n_layers, layer, kv_dim, kvh));
        float k[CRU_HEAD_DIM];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const float4 v = kr[i];
            k[4 * i] = v.x; k[4 * i + 1] = v.y; k[4 * i + 2] = v.z; k[4 * i + 3] = v.w;
        }
        float a[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) a[i] = cru_leaf(q_s[i], q_s[i + 32], k[i], k[i + 32]);
#pragma unroll
        for (int i = 0; i < 16; ++i) a[i] = cru_add(a[i], a[i + 16]);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = cru_add(a[i], a[i + 8]);
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = cru_add(a[i], a[i + 4]);
        a[0] = cru_add(a[0], a[2]);
        a[1] = cru_add(a[1], a[3]);
        a[0] = cru_add(a[0], a[1]);
        scores[j] = cru_scale(a[0]);
    }
    __syncthreads();
    const float inv = cru_ref_softmax(scores, len, red, &bcast);

    float acc = 0.0f;
    for (int base = 0; base < len; base += CRU_DEC_VT) {
        __syncthreads();  // the chain finished reading the previous tile
#pragma unroll
        for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i)
            reinterpret_cast<float4*>(vt)[i * 256 + tid] = vr[i];
        __syncthreads();
        if (base + CRU_DEC_VT < len) {
#pragma unroll
            for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) vr[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            cru_dec_load_v(vr, v_pool, tab, base + CRU_DEC_VT, 0, len, n_layers, layer, kv_dim,
                           kvh);
        }
        if (tid < CRU_HEAD_DIM) {
            const int n = min(CRU_DEC_VT, len - base);
            // Unrolled so the shared loads run ahead of the (ascending, unchanged) fma chain.
#pragma unroll 8
            for (int s = 0; s < n; ++s) acc = cru_pv(scores[base + s], vt[s * CRU_HEAD_DIM + tid], acc);
        }
    }
    if (tid < CRU_HEAD_DIM)
        out[((long long)row * n_heads + head) * CRU_HEAD_DIM + tid] = __fmul_rn(acc, inv);
}
