// attn_ref.h: a plain spelling of the reference attention order for the host drivers
// (decode_attn_driver.cpp, prefill_attn_driver.cpp): DESIGN.md's canonical order, as
// attn_reference (cuda/attention.cu) spells it. Per (row, query head) over positions
// 0 .. n-1: s_j = 0.125 x the xor-butterfly sum (offsets 16, 8, 4, 2, 1) of the 32 leaves
// fma(q[x+32], k[x+32], q[x] k[x]); the max; e_j = exp(s_j - max); the sum as 256 threads
// would form it (thread t adds e_t, e_{t+256}, ... from 0, a butterfly per warp, the eight
// warp sums in order) and its reciprocal; o_d = fma(e_j, v_j[d], o_d) for j ascending from
// 0, times the reciprocal. prelude.h's exp stands in for __expf in kernel and reference
// alike, so a driver checks a kernel's mapping of the order onto threads, tiles and pages,
// not the GPU's exp. Include after prelude.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

// The drivers' geometry: the default model's heads, two layers of which layer 1 is read.
constexpr int HEADS = 9, KV = 3, HD = 64, LAYERS = 2, LAYER = 1, KVD = KV * HD;

// A driver's inputs: K and V pools of n_pages pages and q of q_rows rows (random normals,
// drawn in that order), n_segs segment descriptors for the driver to fill, and their page
// tables, which take_pages fills from the pages in shuffled order: a segment's pages are
// then never adjacent, as in a pool that has served many requests.
struct AttnInputs {
    std::vector<float> k, v, q;  // k/v [n_pages][LAYERS][16][KVD], q [q_rows][HEADS * HD]
    std::vector<int4> segs;
    std::vector<int> tables;  // [n_segs][stride]
    std::vector<int> perm;
    int stride = 0, at = 0;

    void take_pages(int seg, int count) {
        for (int p = 0; p < count; ++p) tables[(size_t)seg * stride + p] = perm[at++];
    }
};

inline AttnInputs attn_inputs(int n_pages, int q_rows, int n_segs, int stride,
                              std::mt19937& gen, std::normal_distribution<float>& normal) {
    AttnInputs in;
    in.perm.resize(n_pages);
    for (int i = 0; i < n_pages; ++i) in.perm[i] = i;
    std::shuffle(in.perm.begin(), in.perm.end(), gen);
    const size_t n = (size_t)n_pages * LAYERS * 16 * KVD;
    in.k.resize(n);
    in.v.resize(n);
    in.q.resize((size_t)q_rows * HEADS * HD);
    for (auto* v : {&in.k, &in.v, &in.q})
        for (float& x : *v) x = normal(gen);
    in.segs.resize(n_segs);
    in.tables.assign((size_t)n_segs * stride, 0);
    in.stride = stride;
    return in;
}

static bool descending = false;  // the negative control: the PV chain run backwards

static float butterfly(float (&v)[32]) {  // lane 0's value after the xor butterfly
    for (int off = 16; off > 0; off >>= 1) {
        float w[32];
        for (int x = 0; x < 32; ++x) w[x] = __fadd_rn(v[x], v[x ^ off]);
        std::memcpy(v, w, sizeof(w));
    }
    return v[0];
}

static void reference(const float* q, const float* k_row0, const float* v_row0,
                      const std::vector<long long>& rows, int len, float* out) {
    // rows[j]: where position j's K/V row starts in the pools (its KV head's 64 floats)
    std::vector<float> e(len);
    for (int d = 0; d < HD; ++d) out[d] = 0.0f;
    float m = -INFINITY;
    for (int j = 0; j < len; ++j) {
        const float* k = k_row0 + rows[j];
        float leaf[32];
        for (int x = 0; x < 32; ++x)
            leaf[x] = __fmaf_rn(q[x + 32], k[x + 32], __fmul_rn(q[x], k[x]));
        e[j] = __fmul_rn(butterfly(leaf), 0.125f);
        m = std::fmax(m, e[j]);
    }
    for (int j = 0; j < len; ++j) e[j] = __expf(__fsub_rn(e[j], m));
    float warp_sum[8];
    for (int w = 0; w < 8; ++w) {
        float lane[32];
        for (int l = 0; l < 32; ++l) {
            float s = 0.0f;
            for (int j = 32 * w + l; j < len; j += 256) s = __fadd_rn(s, e[j]);
            lane[l] = s;
        }
        warp_sum[w] = butterfly(lane);
    }
    float total = warp_sum[0];
    for (int w = 1; w < 8; ++w) total = __fadd_rn(total, warp_sum[w]);
    const float inv = __frcp_rn(total);
    for (int d = 0; d < HD; ++d) {
        float o = 0.0f;
        for (int i = 0; i < len; ++i) {
            const int j = descending ? len - 1 - i : i;
            o = __fmaf_rn(e[j], v_row0[rows[j] + d], o);
        }
        out[d] = __fmul_rn(o, inv);
    }
}


// Where positions 0 .. n-1 of query head h's KV head start in a pool, through a page table.
static std::vector<long long> pool_rows(const int* table, int n, int h) {
    const int kvh = h / (HEADS / KV);
    std::vector<long long> rows(n);
    for (int j = 0; j < n; ++j)
        rows[j] = (((long long)table[j / 16] * LAYERS + LAYER) * 16 + j % 16) * KVD + kvh * HD;
    return rows;
}
