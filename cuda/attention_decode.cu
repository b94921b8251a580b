// attention_decode.cu: paged attention for decode steps (every segment is one row),
// bit-identical to attn_reference (attention.cu) but with the memory parallelism a single
// query row needs.
//
// Layout: as attention.cu. q/out [T, n_heads*64]; k/v pool [pages][n_layers][16][kv_dim];
// segs int4[S] = (packed_start, chunk_len, absolute_start, table_index); tables
// int32[S][table_stride]. Query head h reads KV head h / (n_heads / n_kv_heads).
//
// Thread mapping: grid (n_heads / G, S), 256 threads; one CTA per (G consecutive query heads
// of one KV head, one-row segment). Segment i's row is q/out row segs[i].x: in a decode step
// that is row i; a mixed step launches this kernel over its one-row segments alone.
// An entry with chunk_len 0 is empty (its CTAs exit at once).
// G = 1 is one CTA per (head, row) like the reference, best when the step has few rows;
// G = the group size reads each K/V row once for all the heads sharing
// it, best for large batches. What changes is who computes what, never the arithmetic:
//   - page-table entries of the row's history are staged in shared memory once;
//   - QK, node-parallel: lane octet j (threads 8 j .. 8 j + 7) scores keys j, j + 32, ...,
//     4 per sweep (128 keys a sweep); its thread i holds dims i + 8 m (m < 8) of the key and
//     of each head's q, evaluates level-2 node i of the reference warp's xor-butterfly dot
//     tree (level 1 pairs lanes i and i + 16, then + 8, + 4, + 2, + 1; fp add commutes, so
//     lane 0's butterfly value is exactly this tree), and xor shuffles over 4, 2, 1 build
//     the levels above; an octet's loads of a key are 8 fully used sectors, q needs no
//     shared-memory reads in the sweep, and 80 registers (G = 3) fit 3 CTAs an SM;
//   - softmax: cru_ref_softmax_g (softmax_group.cuh): per head the reference's passes and
//     trees, with the G heads sharing every pass and barrier (thread j's pass reads keys
//     j, j + 256, ..., so a barrier follows QK);
//   - PV: thread d < 64 runs the reference's ascending fused chain of output dimension d for
//     all G heads (one V read feeds G chains), over V tiles of 128 positions staged in shared
//     memory by all 256 threads; the next tile's loads are in flight while the chains run.
// PDL (pdl.cuh): before cru_pdl_wait, the page table is staged, (G = 1) the first V tile
// loads, and the keys and values of positions < min(len - 1, prefetch_len) are prefetched
// into L2 (position len - 1's K/V the step's QKV kernel writes just before this one; q and
// that position load after it). prefetch_len is the host's L2 budget per CTA
// (kernels/attention.py decode_prefetch_len): a few CTAs (batch 1) prefetch their whole
// history, but the ~264 resident CTAs of a large step prefetching everything would
// overflow L2 and evict lines before their loads arrive, reading them from DRAM twice.
// O partials (OW = 1 int8 / 4 f32 weights; 0: none): the batch-1 decode stack folds the O
// projection in here. Each head's output is exactly one 64-wide K chunk of O's input, so
// this CTA owns chunk h of every O column n: partial[h][row][n] = the canonical fma chain
// over d of out[row, h, d] * W_o[n, h*64 + d] (rows_chunk.cuh), left for the next kernel
// to add in ascending h with the scale and the residual (cru_combined). The CTA's slice
// of W_o (o_n columns x 64 weights per head) is copied to shared memory with cp.async
// before cru_pdl_wait (rows_chunk.cuh's piece-major cru_stage_slice), in flight through the
// whole attention; thread t computes columns t, t + 256, t + 512 side by side once every
// head's output is staged.
// MMA (OW = 1 only; CRUCIBLE_GEMM=mma): the partials are the O GEMM's block values in the
// tensor-core order instead (mma_row.cuh): warp w computes the 8-column tiles w, w + 8, ...
// of the staged slice, so the next kernel's combine gives linear_mma's bits.
// O split (o_split = 2, OW != 0): two CTAs a head group, blockIdx.x = 2 * group + s, both
// running the same attention (same bits; the second's output is not stored) and CTA s
// staging and computing only O columns s * o_n / 2 .. of the next o_n / 2. At batch 1
// the 9 CTAs of the stack's attention leave the GPU idle while each walks all of O: the
// pair halves each CTA's slice and O work for a second read of one head's history (L2).
// RoPE in (ROPE, OW = 0, G = the whole group, so one CTA owns each (KV head, row); a
// decode step's attention, kernels/attention.py): q points at the raw QKV row (q_stride
// floats a row) and this kernel does rope_store's work for its heads (model_ops.cu): after
// cru_pdl_wait, warps 0..G-1 rotate the G query heads into q_s, the next warp rotates the
// KV head's K row and two more copy its V row, with rowops.cuh's cru_rope at the row's
// position (segs.z) and the same tables, so every value is rope_store's bits. K and V go to
// the pool at position len - 1 for later steps, and into kv_s for this one: the CTA takes
// that position's K (QK) and V (its tile) from shared memory, never from the pool it
// wrote, so no load here can race the stores. One launch a layer fewer in decode steps.
// Dynamic shared memory: 4 * (128*64 + G*capacity + capacity/16) (+ G*o_n*64*OW bytes of
// W_o); static: q, the softmax scratch and kv_s (variants.decode_static_bytes bounds it).
// No standard headers.
#include "attention_decode_ops.cuh"
#include "common.cuh"
#include "mma_row.cuh"
#include "pdl.cuh"
#include "rows_chunk.cuh"
#include "softmax_group.cuh"

template <int OW> struct CruOWeight { typedef float type; };
template <> struct CruOWeight<1> { typedef signed char type; };

#define CRU_DEC_OCOL 3  // O columns per thread at once (576 = the default model's, / 256)
#define CRU_DEC_KU 4    // keys per lane octet and QK sweep (32 octets: 128 keys a sweep)

template <int G, int OW, bool MMA = false, bool ROPE = false>
__global__ void __launch_bounds__(256, G > 1 ? 3 : 2)
attn_decode(const float* __restrict__ q, const float* __restrict__ k_pool,
            const float* __restrict__ v_pool, const int4* __restrict__ segs, int n_segs,
            const int* __restrict__ tables, int table_stride, float* __restrict__ out,
            int n_heads, int n_kv_heads, int n_layers, int layer, int capacity,
            int prefetch_len, const void* __restrict__ w_o, float* __restrict__ o_parts,
            int o_n, int o_split, int q_stride, const float* __restrict__ rope_cos,
            const float* __restrict__ rope_sin) {
    static_assert(G >= 1 && G <= 4, "attn_decode is instantiated for 1..4 heads per CTA");
    static_assert(!MMA || (G == 1 && OW == 1), "the mma partials take int8 W_o, one head");
    static_assert(!ROPE || OW == 0, "RoPE in is built for the plain form (no O partials)");
    CRU_DYNAMIC_SMEM(float4, dec_smem4);  // rows_chunk.cuh: the host shim maps it too
    float* vt = reinterpret_cast<float*>(dec_smem4);  // [CRU_DEC_VT][64]
    float* scores = vt + CRU_DEC_VT * CRU_HEAD_DIM;    // [G][capacity]
    int* tab = reinterpret_cast<int*>(scores + G * capacity);  // [capacity / 16]
    __shared__ __align__(16) float q_s[G][CRU_HEAD_DIM];  // octet order (cru_dec_q_slot)
    __shared__ CruSoftmaxScratch<G> sm;
    __shared__ __align__(16) float kv_s[ROPE ? 2 : 1][CRU_HEAD_DIM];  // RoPE in: K, V at len - 1
    const int split = OW != 0 ? o_split : 1;  // CTAs a head group (O split, above)
    const int head0 = (blockIdx.x / split) * G, row = blockIdx.y, tid = threadIdx.x;
    const int os = blockIdx.x % split, on = o_n / split, oc0 = os * on;  // this CTA's O columns
    if (row >= n_segs) return;
    // Segment `row` is one row, packed at sd.x: in a decode step sd.x == row; in a mixed
    // step the host hands this kernel only the one-row segments, wherever they are packed.
    const int4 sd = segs[row];
    // A mixed-step graph sizes its one-row list for the most it may hold (backend
    // cupy_mixed_graphs.py); the entries past this step's are empty: uniform early exit.
    if (sd.y == 0) return;
    const long long prow = sd.x;
    const int len = sd.z + 1;
    const int kvh = head0 / (n_heads / n_kv_heads), kv_dim = n_kv_heads * CRU_HEAD_DIM;
    const int* table = tables + (long long)sd.w * table_stride;
    for (int i = tid; i < (len + 15) >> 4; i += 256) tab[i] = table[i];
    typedef typename CruOWeight<OW>::type TW;
    constexpr int O_PIECES = 4 * (int)sizeof(TW);  // 16-byte pieces of a column's chunk
    int4* wo_s = reinterpret_cast<int4*>(tab + capacity / 16);  // [G][piece][on]
    if (OW != 0) {
        const long o_k = (long)n_heads * CRU_HEAD_DIM;
#pragma unroll
        for (int g = 0; g < G; ++g)
            cru_stage_slice<TW>(wo_s + g * O_PIECES * on, static_cast<const TW*>(w_o) + oc0 * o_k,
                                o_k, (head0 + g) * CRU_HEAD_DIM, on, tid, 256);
    }
    __syncthreads();

    // Before the wait: history only (positions < len - 1; see the header).
    const int hist = len - 1, pf = min(hist, prefetch_len);
    float4 vr[CRU_DEC_VT * 16 / 256];
#pragma unroll
    for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) vr[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // One head: the first V tile is in flight through QK. G heads: registers go to QK, and
    // the tile loads after it (from L2, prefetched here), in flight through the softmax.
    if (G == 1) cru_dec_load_v(vr, v_pool, tab, 0, 0, hist, n_layers, layer, kv_dim, kvh);
    for (int j = tid; j < pf; j += 256)  // keys first: QK needs them first
        cru_dec_prefetch(k_pool, tab, j, n_layers, layer, kv_dim, kvh);
    // Values too, so the V tiles after QK load from L2 (G = 1 holds tile 0 in registers).
    for (int j = tid + (G == 1 ? CRU_DEC_VT : 0); j < pf; j += 256)
        cru_dec_prefetch(v_pool, tab, j, n_layers, layer, kv_dim, kvh);
    cru_pdl_wait();
    cru_pdl_trigger();
    // RoPE in: position len - 1 comes from kv_s, so the pool's loads stop at hist.
    const int pool_len = ROPE ? hist : len;
    if (ROPE) {
        cru_dec_rope_in<G>(q + prow * q_stride, n_heads, kv_dim, head0, kvh, rope_cos + sd.z * 32,
                           rope_sin + sd.z * 32, q_s,
                           const_cast<float*>(k_pool) + cru_pool_row(tab, hist, n_layers, layer, kv_dim, kvh),
                           const_cast<float*>(v_pool) + cru_pool_row(tab, hist, n_layers, layer, kv_dim, kvh),
                           kv_s[0], kv_s[ROPE ? 1 : 0], tid);
    } else if (tid < G * CRU_HEAD_DIM) {
        q_s[tid >> 6][cru_dec_q_slot(tid & 63)] = q[prow * q_stride + head0 * CRU_HEAD_DIM + tid];
    }
    if (G == 1) cru_dec_load_v(vr, v_pool, tab, 0, hist, pool_len, n_layers, layer, kv_dim, kvh);
    // QK: the lane octet `grp` (8 threads) scores keys grp, grp + 32, ..., CRU_DEC_KU of
    // them per sweep, thread `node` holding the key's and q's dims node + 8 m in registers.
    // The first sweep's key loads are issued before the barrier that publishes q_s, so
    // their latency overlaps q's instead of following it.
    const int node = tid & 7, grp = tid >> 3;
    float k[CRU_DEC_KU][8];
#pragma unroll
    for (int u = 0; u < CRU_DEC_KU; ++u) {
        const int pos = grp + 32 * u;
        if (pos < pool_len)
            cru_dec_load_knode(k[u], k_pool, tab, pos, node, n_layers, layer, kv_dim, kvh);
    }
    __syncthreads();  // q_s (and, RoPE in, kv_s) published
    if (ROPE) {
#pragma unroll
        for (int u = 0; u < CRU_DEC_KU; ++u)
            if (grp + 32 * u == hist) cru_dec_knode_smem(k[u], kv_s[0], node);
    }
    float qr[G][8];  // q dims node + 8 m: octet-order slots 8 node .. 8 node + 7
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float4 lo = *reinterpret_cast<const float4*>(&q_s[g][8 * node]);
        const float4 hi = *reinterpret_cast<const float4*>(&q_s[g][8 * node + 4]);
        qr[g][0] = lo.x; qr[g][1] = lo.y; qr[g][2] = lo.z; qr[g][3] = lo.w;
        qr[g][4] = hi.x; qr[g][5] = hi.y; qr[g][6] = hi.z; qr[g][7] = hi.w;
    }
    for (int base = 0; base < len; base += 32 * CRU_DEC_KU) {  // uniform: shuffles inside
#pragma unroll
        for (int u = 0; u < CRU_DEC_KU; ++u) {
            const int pos = base + grp + 32 * u;
            float sc[G];
            cru_dec_node_dots<G>(k[u], qr, sc);  // (pos >= len: k[u] unloaded, sc unused)
            // Lane `node` of the octet stores head `node`'s score.
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (node == g && pos < len) scores[g * capacity + pos] = sc[g];
            const int next = pos + 32 * CRU_DEC_KU;
            if (next < pool_len)
                cru_dec_load_knode(k[u], k_pool, tab, next, node, n_layers, layer, kv_dim, kvh);
            else if (ROPE && next == hist)
                cru_dec_knode_smem(k[u], kv_s[0], node);
        }
    }
    if (G > 1) cru_dec_load_v(vr, v_pool, tab, 0, 0, pool_len, n_layers, layer, kv_dim, kvh);
    __syncthreads();  // the softmax's thread j reads the scores of keys j, j + 256, ...
    cru_ref_softmax_g<G>(scores, capacity, len, sm);

    const int d = tid & 63;  // the output dimension this thread's chains own, if tid < 64
    float acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
    for (int base = 0;;) {  // vt is free: tile 0 is its first use, later tiles follow a barrier
#pragma unroll
        for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) {
            float4 val = vr[i];
            if (ROPE && base + 16 * i + (tid >> 4) == hist)  // position len - 1: from kv_s
                val = reinterpret_cast<const float4*>(kv_s[ROPE ? 1 : 0])[tid & 15];
            reinterpret_cast<float4*>(vt)[i * 256 + tid] = val;
        }
        __syncthreads();  // the tile (and, the first time, sm.inv) is visible
        const bool more = base + CRU_DEC_VT < len;
        if (more) {
#pragma unroll
            for (int i = 0; i < CRU_DEC_VT * 16 / 256; ++i) vr[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            cru_dec_load_v(vr, v_pool, tab, base + CRU_DEC_VT, 0, pool_len, n_layers, layer,
                           kv_dim, kvh);
        }
        if (tid < CRU_HEAD_DIM)
            cru_dec_pv_tile<G>(vt, scores + base, capacity, min(CRU_DEC_VT, len - base), d, acc);
        base += CRU_DEC_VT;
        if (!more) break;
        __syncthreads();  // the chains finished reading the tile
    }
    if (tid < CRU_HEAD_DIM) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float o = __fmul_rn(acc[g], sm.inv[g]);
            if (os == 0) out[(prow * n_heads + head0 + g) * CRU_HEAD_DIM + d] = o;
            if (OW != 0) q_s[g][d] = o;  // q is dead: its slots now hold the output
        }
    }
    if (MMA) {
        cru_cp_wait_all();
        __syncthreads();  // the output and every thread's W_o pieces are visible
        unsigned b[4][2];
        cru_row_b(q_s[0], tid & 31, b);
        cru_row_slice(wo_s, on, b, o_parts + ((long long)head0 * n_segs + row) * o_n + oc0,
                      tid >> 5, 8, tid & 31);
    } else if (OW != 0) {
        cru_cp_wait_all();
        __syncthreads();  // the outputs and every thread's W_o pieces are visible
        // CRU_DEC_OCOL columns per thread side by side, so their chains overlap (columns
        // past o_n compute column 0's again and are not stored).
        for (int n0 = tid; n0 < on; n0 += 256 * CRU_DEC_OCOL) {
            int cols[CRU_DEC_OCOL];
#pragma unroll
            for (int j = 0; j < CRU_DEC_OCOL; ++j)
                cols[j] = n0 + 256 * j < on ? n0 + 256 * j : 0;
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float acc[CRU_DEC_OCOL];
                cru_slice_chains<TW, CRU_DEC_OCOL>(wo_s + g * O_PIECES * on, on, cols, q_s[g],
                                                   acc);
#pragma unroll
                for (int j = 0; j < CRU_DEC_OCOL; ++j)
                    if (n0 + 256 * j < on)
                        o_parts[((long long)(head0 + g) * n_segs + row) * o_n + oc0 + n0 + 256 * j] =
                            acc[j];
            }
        }
    }
}

#ifndef __CUDACC_RTC__
// Offline `nvcc -c` builds instantiate what the host launches, so `-Xptxas -v` reports it.
#define CRU_DEC_ARGS                                                                   \
    (const float*, const float*, const float*, const int4*, int, const int*, int, float*, int, \
     int, int, int, int, int, const void*, float*, int, int, int, const float*, const float*)
#define CRU_DEC_INSTANTIATE(G, OW) template __global__ void attn_decode<G, OW> CRU_DEC_ARGS;
CRU_DEC_INSTANTIATE(1, 0)
CRU_DEC_INSTANTIATE(3, 0)
CRU_DEC_INSTANTIATE(1, 1)
CRU_DEC_INSTANTIATE(1, 4)
template __global__ void attn_decode<1, 1, true> CRU_DEC_ARGS;
template __global__ void attn_decode<3, 0, false, true> CRU_DEC_ARGS;
#endif
