// mma_row.cuh: one row's block values in the tensor-core GEMM order (linear_mma.cu states
// it), for the kernels of the batch-1 decode stack under CRUCIBLE_GEMM=mma.
//
// Why: the stack hands a GEMM's per-64-block partials from one kernel to the next and adds
// them there in ascending block order (rows_chunk.cuh's cru_combined, decode_mlp's
// finisher). In linear.cu's order a partial is a 64-long fma chain; in the mma order it is
// the block value b_c = 0 + ((lo_c + mid_c) + hi_c), exactly what linear_mma_rows.cu
// stores to shared memory before its finisher adds the blocks from 0. So a kernel that
// computes b_c with the same four mma steps (the same k in the same slots) and leaves it
// where the fma stack leaves its chain gives the unfused mma layer's bits.
//
// Fragment use (mma_common.cuh's layout, lane = 4 g + t), with the operands' roles swapped
// against linear_mma_rows: one row leaves 15 of the 16 A rows idle there, so here the
// weights are A (rows g and g + 8: two 8-column tiles' columns g) and the row's three bf16
// parts are B's columns 0, 1, 2 (hi, mid, lo; columns 3..7 zeros). One m16n8k16 step then
// serves 16 columns and all three parts, where the row-as-A form took three steps for 8.
// The bits are the same: each output element is c + the sum of 16 exact bf16 products in
// the same k slots (lane t feeds k = 16 t + 4 j .. + 3 at step j, in both forms), and an
// element's three part chains still run separately from 0 over the four steps j; only
// which operand carries which factor changed. The GPU checks compare the two bitwise
// (checks/stack_check.py against the unfused mma stages).
// No standard headers (NVRTC).
#pragma once
#include "mma_common.cuh"
#include "rows_chunk.cuh"  // cru_cp16

// This lane's B fragments of a row's 64-value block for all four steps j: B column g is
// part g of x (hi, mid, lo for g = 0, 1, 2; zeros for g >= 3), in the k slots of lane t.
// They depend on the block and the lane only, so a warp builds them once per block and
// every 16-column pair of the block reuses them (splitting x per pair cost more ALU than
// the pair's mmas and code conversions together). x64: the row's 64 values of the block
// (shared memory, 16-byte aligned).
__device__ __forceinline__ void cru_row_b(const float* x64, int lane, unsigned (&b)[4][2]) {
    const int g = lane >> 2;
    const float4* x4 = reinterpret_cast<const float4*>(x64 + 16 * (lane & 3));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float4 v = x4[j];
        const float xv[4] = {v.x, v.y, v.z, v.w};
        float part[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float hi, mid, lo;
            cru_split3(xv[e], hi, mid, lo);
            part[e] = g == 0 ? hi : g == 1 ? mid : g == 2 ? lo : 0.0f;
        }
        b[j][0] = cru_bf16x2(part[0], part[1]);
        b[j][1] = cru_bf16x2(part[2], part[3]);
    }
}

// The same fragments staged in shared memory, for a kernel whose warps all read one block
// (decode_mlp's down: every warp takes the same 64 SwiGLU outputs): the thread that makes
// a pair of values writes its three parts once, and each warp loads its fragments instead
// of splitting the 64 values itself. bw: 96 words, 16-byte aligned; word 32 s + i holds
// part s (hi, mid, lo) of values 2 i and 2 i + 1 of the block as bf16x2, which is b[j][w]
// of lane (s, t) for i = 8 t + 2 j + w (cru_row_b's k slots).
// The three words themselves (w[s]: part s of the pair), for a writer that stores them
// elsewhere too (decode_mlp_pair: also into its peer CTA).
__device__ __forceinline__ void cru_row_b_words(float x0, float x1, unsigned (&w)[3]) {
    float h0, m0, l0, h1, m1, l1;
    cru_split3(x0, h0, m0, l0);
    cru_split3(x1, h1, m1, l1);
    w[0] = cru_bf16x2(h0, h1);
    w[1] = cru_bf16x2(m0, m1);
    w[2] = cru_bf16x2(l0, l1);
}
__device__ __forceinline__ void cru_row_b_put(unsigned* bw, int i, float x0, float x1) {
    unsigned w[3];
    cru_row_b_words(x0, x1, w);
    bw[i] = w[0];
    bw[32 + i] = w[1];
    bw[64 + i] = w[2];
}

// This lane's fragments from a block staged by cru_row_b_put (lanes g >= 3: zeros).
__device__ __forceinline__ void cru_row_b_get(const unsigned* bw, int lane,
                                              unsigned (&b)[4][2]) {
    const int g = lane >> 2;
    uint4 w0 = make_uint4(0u, 0u, 0u, 0u), w1 = w0;
    if (g < 3) {
        const uint4* src = reinterpret_cast<const uint4*>(bw + 32 * g + 8 * (lane & 3));
        w0 = src[0];
        w1 = src[1];
    }
    b[0][0] = w0.x; b[0][1] = w0.y; b[1][0] = w0.z; b[1][1] = w0.w;
    b[2][0] = w1.x; b[2][1] = w1.y; b[3][0] = w1.z; b[3][1] = w1.w;
}

// The block values of the row against two 8-column tiles, from fetch(j, a): step j's A
// registers (a[0], a[2]: column g of the first tile, slots 2t, 2t + 1 and 2t + 8, 2t + 9,
// which hold codes k, k + 1 and k + 2, k + 3 for k = 16 t + 4 j of the block; a[1], a[3]:
// the same of the second tile). b: cru_row_b of the block. Every lane must call it (a
// shuffle). Meaningful in lanes t == 0: the values of column g of the first tile (x) and of
// the second (y), each 0 + ((lo + mid) + hi) as linear_mma_rows stores them.
template <class Fetch>
__device__ __forceinline__ float2 cru_row_pair_of(const unsigned (&b)[4][2], Fetch fetch) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        unsigned a[4];
        fetch(j, a);
        cru_mma(d, a, b[j]);
    }
    // Lane (g, 0) holds hi and mid of its two columns (d0, d1; d2, d3), lane (g, 1) their lo.
    const float lo_a = __shfl_down_sync(0xffffffffu, d[0], 1);
    const float lo_b = __shfl_down_sync(0xffffffffu, d[2], 1);
    return make_float2(__fadd_rn(0.0f, __fadd_rn(__fadd_rn(lo_a, d[1]), d[0])),
                       __fadd_rn(0.0f, __fadd_rn(__fadd_rn(lo_b, d[3]), d[2])));
}

// From int8 codes: qa, qb this lane's int4s of column g of each tile (k = 16 t .. 16 t + 15
// of the block), converted to bf16 here.
__device__ __forceinline__ float2 cru_row_pair(const unsigned (&b)[4][2], int4 qa, int4 qb) {
    return cru_row_pair_of(b, [&](int j, unsigned (&a)[4]) {
        unsigned ca[2], cb[2];
        cru_codes_b(cru_word(qa, j), ca);
        cru_codes_b(cru_word(qb, j), cb);
        a[0] = ca[0];
        a[1] = cb[0];
        a[2] = ca[1];
        a[3] = cb[1];
    });
}

// From the codes as bf16 (DeviceWeight.wb): qa[0], qa[1] this lane's 16 codes of column g
// of the first tile (k = 16 t .. 16 t + 7 and 16 t + 8 .. 16 t + 15: words 2 (j % 2) and
// 2 (j % 2) + 1 of int4 j / 2 are step j's pairs), qb the second tile's. The same A
// registers as cru_row_pair makes from the int8 codes (each code is a bf16 exactly), so the
// same bits, without the conversion: at one row the conversion was about a tenth of a
// batch-1 token under mma (a timing probe without it: 1,851 -> 2,050 tok/s).
__device__ __forceinline__ float2 cru_row_pair_bf(const unsigned (&b)[4][2],
                                                  const int4 (&qa)[2], const int4 (&qb)[2]) {
    return cru_row_pair_of(b, [&](int j, unsigned (&a)[4]) {
        const int w = 2 * (j & 1);
        a[0] = (unsigned)cru_word(qa[j >> 1], w);
        a[1] = (unsigned)cru_word(qb[j >> 1], w);
        a[2] = (unsigned)cru_word(qa[j >> 1], w + 1);
        a[3] = (unsigned)cru_word(qb[j >> 1], w + 1);
    });
}

// Pair q's two values (cru_row_pair's x and y: columns g and 8 + g of the pair) to
// out[16 q ..], from the lanes t == 0 that hold them.
__device__ __forceinline__ void cru_row_pair_store(float* out, int q, float2 v, int lane) {
    if ((lane & 3) == 0) {
        out[16 * q + (lane >> 2)] = v.x;
        out[16 * q + 8 + (lane >> 2)] = v.y;
    }
}

// The block values of the row against the 16-column pairs pair0, pair0 + pstep, ... <
// n_cols / 16 of a staged slice (rows_chunk.cuh's piece-major cru_stage_slice layout: piece
// p of column n at int4 slot p * n_cols + n; int8 codes, so 4 pieces of 16), written to
// out[n] for column n. b: the row's fragments of the slice's block (cru_row_b or
// cru_row_b_get). n_cols % 16 == 0; the loop bound is warp-uniform (cru_row_pair's shuffle).
__device__ __forceinline__ void cru_row_slice(const int4* slice, int n_cols,
                                              const unsigned (&b)[4][2], float* out,
                                              int pair0, int pstep, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 2  // two pairs' independent mma chains in flight
    for (int pair = pair0; pair < n_cols / 16; pair += pstep) {
        const int4* q = slice + t * n_cols + 16 * pair + g;
        const float2 v = cru_row_pair(b, q[0], q[8]);
        cru_row_pair_store(out, pair, v, lane);
    }
}

// A warp's NT tiles of one block as bf16 codes in shared memory, staged by each lane for
// itself (cp.async; the lane that reads a slot wrote it, so cru_cp_wait_all alone orders
// them): int4 slot (2 n + h) * 32 + lane holds codes k0 + 16 t + 8 h .. + 7 of column
// col(n) (tile n's column g for this lane), so each read is 32 lanes' consecutive 16 bytes.
// w: [N, K] bf16 codes; NT KB of dst a warp. Why shared memory and not registers: the
// registers of bf16 codes beside the kernel's own would spill at its thread count.
template <int NT, class Col>
__device__ __forceinline__ void cru_stage_tiles_bf(int4* dst, const unsigned short* w, long K,
                                                   long k0, Col col, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            cru_cp16(dst + (2 * n + h) * 32 + lane, w + (long)col(n) * K + k0 + 16 * t + 8 * h);
}

// The block values of NT / 2 tile pairs staged by cru_stage_tiles_bf (staged tiles 2 p and
// 2 p + 1 form pair p), pair p's 16 columns written at out[16 q ..] for q = pair0 + p *
// pstep: where cru_row_tiles8 leaves a block's 64 columns, or a part of them.
template <int NT>
__device__ __forceinline__ void cru_row_tiles_bf(const int4* st, const unsigned (&b)[4][2],
                                                 float* out, int lane, int pair0, int pstep) {
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
        const int4* q = st + 4 * p * 32 + lane;
        const int4 qa[2] = {q[0], q[32]}, qb[2] = {q[64], q[96]};
        const float2 v = cru_row_pair_bf(b, qa, qb);
        cru_row_pair_store(out, pair0 + p * pstep, v, lane);
    }
}

// Eight tiles' block values (64 columns: a head's, or 32 gate and 32 up columns) of the row
// against the codes a lane holds in raw[n / 4].v[n % 4] (tile n, RawChunk's int4s; column
// 8 n + g of the 64), to out[8 n + g]: where the fma forms leave their chains. b: the
// row's fragments of the block (cru_row_b or cru_row_b_get).
template <typename Raw>
__device__ __forceinline__ void cru_row_tiles8(const Raw (&raw)[2], const unsigned (&b)[4][2],
                                               float* out, int lane) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {  // tiles 2 h and 2 h + 1
        const float2 v = cru_row_pair(b, raw[h >> 1].v[(2 * h) & 3],
                                      raw[h >> 1].v[(2 * h + 1) & 3]);
        cru_row_pair_store(out, h, v, lane);
    }
}
