// attention_decode.cu: paged attention for decode steps (every segment is one row),
// bit-identical to attn_reference (attention.cu) but with the memory parallelism a single
// query row needs.
//
// Layout: as attention.cu. q/out [T, n_heads*64]; k/v pool [pages][n_layers][16][kv_dim];
// segs int4[S] = (packed_start, chunk_len, absolute_start, table_index); tables
// int32[S][table_stride]. Query head h reads KV head h / (n_heads / n_kv_heads).
//
// Thread mapping: grid (n_heads / G, T), 256 threads; one CTA per (G consecutive query heads
// of one KV head, row). G = 1 is one CTA per (head, row) like the reference, best when the
// step has few rows; G = the group size reads each K/V row once for all the heads sharing
// it, best for large batches. What changes is who computes what, never the arithmetic:
//   - page-table entries of the row's history are staged in shared memory once;
//   - QK: thread j loads key j's 64 floats (16 float4) once and, for each of the G heads,
//     replays the reference warp's xor-butterfly dot tree sequentially (level 1 pairs
//     lanes i and i + 16, then + 8, + 4, + 2, + 1; fp add commutes, so lane 0's butterfly
//     value is exactly this tree); 256 keys per sweep;
//   - softmax: cru_ref_softmax (common.cuh), the reference's own code, once per head;
//   - PV: threads g*64 .. g*64+63 run head g's ascending fused chain (the reference's),
//     one output dimension each, over V tiles of 128 positions staged in shared memory by
//     all 256 threads; the next tile's loads are in flight while the chains consume one.
// PDL (pdl.cuh): before cru_pdl_wait, the page table and (G = 1) the first V tile load and
// the keys are prefetched into L2, all except position len - 1, whose K/V the step's QKV kernel
// writes just before this one; q and that position load after it.
// Dynamic shared memory: 4 * (128*64 + G*capacity + capacity/16). No standard headers.
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

template <int G>
__global__ void __launch_bounds__(256, 2)
attn_decode(const float* __restrict__ q, const float* __restrict__ k_pool,
            const float* __restrict__ v_pool, const int4* __restrict__ segs, int n_segs,
            const int* __restrict__ tables, int table_stride, float* __restrict__ out,
            int n_heads, int n_kv_heads, int n_layers, int layer, int capacity) {
    static_assert(G >= 1 && G * CRU_HEAD_DIM <= 256, "G heads of 64 need G*64 <= 256 threads");
    extern __shared__ float4 dec_smem4[];
    float* vt = reinterpret_cast<float*>(dec_smem4);  // [CRU_DEC_VT][64]
    float* scores = vt + CRU_DEC_VT * CRU_HEAD_DIM;    // [G][capacity]
    int* tab = reinterpret_cast<int*>(scores + G * capacity);  // [capacity / 16]
    __shared__ float q_s[G][CRU_HEAD_DIM];
    __shared__ float red[8];
    __shared__ float bcast;
    const int head0 = blockIdx.x * G, row = blockIdx.y, tid = threadIdx.x;
    if (row >= n_segs) return;
    const int4 sd = segs[row];  // decode: segment `row` is row `row` (one row each)
    const int len = sd.z + 1;
    const int kvh = head0 / (n_heads / n_kv_heads), kv_dim = n_kv_heads * CRU_HEAD_DIM;
    const int* table = tables + (long long)sd.w * table_stride;
    for (int i = tid; i < (len + 15) >> 4; i += 256) tab[i] = table[i];
    __syncthreads();

    // Before the wait: history only (positions < len - 1; see the header).
    const int hist = len - 1;
    float4 vr[CRU_DEC_VT * 16 / 256];
#pragma unroll
    for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) vr[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // One head: the first V tile is in flight through QK. G heads: registers go to QK, and
    // the tile loads after it, in flight through the G softmaxes instead.
    if (G == 1) cru_dec_load_v(vr, v_pool, tab, 0, 0, hist, n_layers, layer, kv_dim, kvh);
    for (int j = tid; j < hist; j += 256)
        cru_dec_prefetch_k(k_pool, tab, j, n_layers, layer, kv_dim, kvh);
    cru_pdl_wait();
    cru_pdl_trigger();
    if (tid < G * CRU_HEAD_DIM)
        q_s[tid >> 6][tid & 63] = q[((long long)row * n_heads + head0) * CRU_HEAD_DIM + tid];
    if (G == 1) cru_dec_load_v(vr, v_pool, tab, 0, hist, len, n_layers, layer, kv_dim, kvh);
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
#pragma unroll 1
        for (int g = 0; g < G; ++g) {  // one tree at a time: three would spill
            // Leaves i and i + 16 are added as soon as both exist (level 1 of the tree), so
            // 16 values are live instead of 32.
            float a[16];
#pragma unroll
            for (int i = 0; i < 16; ++i)
                a[i] = cru_add(cru_leaf(q_s[g][i], q_s[g][i + 32], k[i], k[i + 32]),
                               cru_leaf(q_s[g][i + 16], q_s[g][i + 48], k[i + 16], k[i + 48]));
#pragma unroll
            for (int i = 0; i < 8; ++i) a[i] = cru_add(a[i], a[i + 8]);
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = cru_add(a[i], a[i + 4]);
            a[0] = cru_add(a[0], a[2]);
            a[1] = cru_add(a[1], a[3]);
            a[0] = cru_add(a[0], a[1]);
            scores[g * capacity + j] = cru_scale(a[0]);
        }
    }
    if (G > 1) cru_dec_load_v(vr, v_pool, tab, 0, 0, len, n_layers, layer, kv_dim, kvh);
    __syncthreads();
    __shared__ float inv_s[G];  // 1 / sum per head (kept in shared memory: registers are full)
    for (int g = 0; g < G; ++g) {
        const float inv = cru_ref_softmax(scores + g * capacity, len, red, &bcast);
        if (tid == 0) inv_s[g] = inv;
    }

    const int g = tid >> 6, d = tid & 63;  // the chain this thread runs, if tid < G*64
    const float* sc = scores + g * capacity;
    float acc = 0.0f;
    for (int base = 0; base < len; base += CRU_DEC_VT) {
        __syncthreads();  // the chains finished reading the previous tile
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
        if (tid < G * CRU_HEAD_DIM) {
            const int n = min(CRU_DEC_VT, len - base);
            // Unrolled so the shared loads run ahead of the (ascending, unchanged) fma chain.
#pragma unroll 8
            for (int s = 0; s < n; ++s) acc = cru_pv(sc[base + s], vt[s * CRU_HEAD_DIM + d], acc);
        }
    }
    if (tid < G * CRU_HEAD_DIM)  // inv_s was written before the tile loop's barriers
        out[((long long)row * n_heads + head0 + g) * CRU_HEAD_DIM + d] = __fmul_rn(acc, inv_s[g]);
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate what the host launches, so `-Xptxas -v` reports it.
template __global__ void attn_decode<1>(const float*, const float*, const float*, const int4*,
                                        int, const int*, int, float*, int, int, int, int, int);
template __global__ void attn_decode<3>(const float*, const float*, const float*, const int4*,
                                        int, const int*, int, float*, int, int, int, int, int);
#endif
