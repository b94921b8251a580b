// decode_attn_driver.cpp: cuda/attention_decode.cu (attn_decode<G, 0>) run on the host
// (prelude.h) against a plain spelling of the reference attention order, bit for bit
// (tests/test_kernels_on_host.py builds it).
//
// The reference is attn_ref.h's (DESIGN.md's canonical order, as attn_reference spells it).
//
// Sweep: one and three query heads a CTA (9 query heads over 3 KV heads, the default
// model's), histories of 1 to 700 positions around the QK sweep (128 keys) and V tile (128)
// edges, pages shuffled, two layers (layer 1 read), all rows in one launch with an empty
// entry among them; then the decode stack's forms (one head a CTA, W_o's chunk partials
// of 192 columns: f32 and int8 W_o as 64-long fma chains from 0, int8 as the tensor-core
// order's block values, mma_ref.h) on 4 of the rows (1, 17, 129, 300 positions), each
// also with the O split (two CTAs a head, each storing half of O's columns; the second's
// attention output unstored). A run is one (form, row): 50. `descending` as the first
// argument makes the reference's PV chain run in descending history order: the negative
// control, which must fail every run of two positions or more (42 of 50).
#include "prelude.h"
#include "attention_decode.cu"
#include "mma_ref.h"
#include "attn_ref.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

// The RoPE-in form (attn_decode<3, 0, false, true>) on the same rows: the raw QKV rows and
// the RoPE tables random; position n - 1 of each row's history starts as a sentinel in the
// pools. Want: the pools with that position's K (rotated by cru_rope at position n - 1) and
// V (copied) in place, everything else untouched (the empty entry's places too), and each
// head's output the reference attention of its rotated q over those pools. One run a row.
static void rope_in_runs(const AttnInputs& in, const std::vector<int>& lens, int S,
                         int capacity, int stride, std::mt19937& gen,
                         std::normal_distribution<float>& normal, int& runs, int& fails) {
    constexpr int W = (HEADS + 2 * KV) * HD, HALF = HD / 2;
    const int max_len = *std::max_element(lens.begin(), lens.end());
    std::vector<float> raw((size_t)S * W), cos_t((size_t)max_len * HALF),
        sin_t((size_t)max_len * HALF);
    for (auto* v : {&raw, &cos_t, &sin_t})
        for (float& x : *v) x = normal(gen);
    std::vector<float> k = in.k, v = in.v, want_k = in.k, want_v = in.v;
    std::vector<float> q((size_t)S * HEADS * HD);  // the rotated queries
    for (int i = 0; i < S; ++i) {
        const int4 sd = in.segs[i];
        const float* r = &raw[(size_t)i * W];
        const float *c = &cos_t[(size_t)sd.z * HALF], *sn = &sin_t[(size_t)sd.z * HALF];
        for (int h = 0; h < HEADS + KV; ++h)
            for (int j = 0; j < HALF; ++j) {
                if (h >= HEADS && sd.y == 0) continue;  // the empty entry stores nothing
                const float2 x = cru_rope(r[h * HD + j], r[h * HD + j + HALF], c[j], sn[j]);
                float* dst = h < HEADS ? &q[((size_t)i * HEADS + h) * HD]
                                       : &want_k[pool_rows(&in.tables[(size_t)i * stride],
                                                           sd.z + 1, (h - HEADS) * (HEADS / KV))
                                                     [sd.z]];
                dst[j] = x.x;
                dst[j + HALF] = x.y;
            }
        for (int kvh = 0; kvh < KV && sd.y; ++kvh) {
            const long long at = pool_rows(&in.tables[(size_t)i * stride], sd.z + 1,
                                           kvh * (HEADS / KV))[sd.z];
            for (int d = 0; d < HD; ++d) {
                want_v[at + d] = r[(HEADS + KV + kvh) * HD + d];
                k[at + d] = v[at + d] = -12345.0f;  // the kernel must write these
            }
        }
    }
    std::vector<float> out((size_t)S * HEADS * HD, -12345.0f);
    run_grid(dim3{HEADS / 3, (unsigned)S, 1}, dim3{256, 1, 1}, [&] {
        attn_decode<3, 0, false, true>(raw.data(), k.data(), v.data(), in.segs.data(), S,
                                       in.tables.data(), stride, out.data(), HEADS, KV, LAYERS,
                                       LAYER, capacity, 0, nullptr, nullptr, 0, 1, W,
                                       cos_t.data(), sin_t.data());
    });
    const bool pools = k == want_k && v == want_v;
    if (!pools) printf("rope in: the pools differ from rope_store's\n");
    fails += !pools;
    for (int i = 0; i < S; ++i) {
        const int n = in.segs[i].z + 1;
        bool ok = true;
        for (int h = 0; h < HEADS; ++h) {
            if (in.segs[i].y == 0) {
                ok = ok && out[((size_t)i * HEADS + h) * HD] == -12345.0f;
                continue;
            }
            float want[HD];
            reference(&q[((size_t)i * HEADS + h) * HD], want_k.data(), want_v.data(),
                      pool_rows(in.tables.data() + (size_t)i * stride, n, h), n, want);
            ok = ok && std::memcmp(want, &out[((size_t)i * HEADS + h) * HD], sizeof(want)) == 0;
        }
        if (in.segs[i].y == 0) {
            fails += !ok;
            continue;
        }
        ++runs;
        if (!ok) {
            ++fails;
            printf("rope in, history %d: differs\n", n);
        }
    }
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 gen(5);
    std::normal_distribution<float> normal;
    const std::vector<int> lens = {1, 2, 15, 16, 17, 127, 128, 129, 255, 256, 257, 300, 700};
    const int S = (int)lens.size() + 1;  // entry 3 is empty (chunk_len 0)
    int max_len = 0, n_pages = 0;
    for (int n : lens) {
        max_len = std::max(max_len, n);
        n_pages += (n + 15) / 16;
    }
    const int capacity = (max_len + 255) / 256 * 256, stride = (max_len + 15) / 16;
    AttnInputs in = attn_inputs(n_pages, S, S, stride, gen, normal);
    for (int i = 0, e = 0; i < S; ++i) {
        if (i == 3) {  // an empty entry, as a mixed-step graph's one-row list pads with
            in.segs[i] = make_int4(i, 0, 0, i);
            continue;
        }
        const int n = lens[e++];
        in.segs[i] = make_int4(i, 1, n - 1, i);  // row i, one position, at n - 1: n positions
        in.take_pages(i, (n + 15) / 16);
    }
    // W_o [ON, HEADS * HD]: f32 values and int8 codes (the decode stack's O projection)
    constexpr int ON = 192, OK = HEADS * HD;
    std::vector<float> wf((size_t)ON * OK);
    std::vector<signed char> w8((size_t)ON * OK);
    std::uniform_int_distribution<int> code(-127, 127);
    for (size_t i = 0; i < wf.size(); ++i) {
        wf[i] = normal(gen);
        w8[i] = (signed char)code(gen);
    }
    int runs = 0, fails = 0;
    // forms: 0 = attn_decode<1, 0>, 1 = <3, 0>, 2 = <1, 4> (f32 W_o), 3 = <1, 1>, 4 = <1, 1,
    // true>; 5, 6, 7: forms 2, 3, 4 with the O split (two CTAs a head, half the columns each)
    for (int form = 0; form < 8; ++form) {
        const int G = form == 1 ? 3 : 1, split = form >= 5 ? 2 : 1;
        const int kind = form >= 5 ? form - 3 : form;  // the form's W_o and order
        // The stack's forms (batch-1 decode) take four of the rows; the others' entries
        // are empty, so their CTAs leave at once (and must write nothing).
        std::vector<int4> sg = in.segs;
        if (form >= 2)
            for (auto& e : sg)
                if (e.y && e.z + 1 != 1 && e.z + 1 != 17 && e.z + 1 != 129 && e.z + 1 != 300)
                    e.y = 0;
        std::vector<float> out(in.q.size(), -12345.0f);  // a sentinel: a missed write shows
        std::vector<float> parts((size_t)HEADS * S * ON, -12345.0f);
        auto launch = [&] {
            const float *qq = in.q.data(), *k = in.k.data(), *v = in.v.data();
            const int* t = in.tables.data();
            float *o = out.data(), *pp = parts.data();
            switch (kind) {
                case 0: attn_decode<1, 0>(qq, k, v, sg.data(), S, t, stride, o, HEADS, KV,
                                          LAYERS, LAYER, capacity, 0, nullptr, nullptr, 0, 1,
                                          HEADS * HD, nullptr, nullptr);
                        break;
                case 1: attn_decode<3, 0>(qq, k, v, sg.data(), S, t, stride, o, HEADS, KV,
                                          LAYERS, LAYER, capacity, 0, nullptr, nullptr, 0, 1,
                                          HEADS * HD, nullptr, nullptr);
                        break;
                case 2: attn_decode<1, 4>(qq, k, v, sg.data(), S, t, stride, o, HEADS, KV,
                                          LAYERS, LAYER, capacity, 0, wf.data(), pp, ON, split,
                                          HEADS * HD, nullptr, nullptr);
                        break;
                case 3: attn_decode<1, 1>(qq, k, v, sg.data(), S, t, stride, o, HEADS, KV,
                                          LAYERS, LAYER, capacity, 0, w8.data(), pp, ON, split,
                                          HEADS * HD, nullptr, nullptr);
                        break;
                default: attn_decode<1, 1, true>(qq, k, v, sg.data(), S, t, stride, o, HEADS,
                                                 KV, LAYERS, LAYER, capacity, 0, w8.data(), pp,
                                                 ON, split, HEADS * HD, nullptr, nullptr);
            }
        };
        run_grid(dim3{(unsigned)(HEADS / G * split), (unsigned)S, 1}, dim3{256, 1, 1}, launch);
        for (int i = 0; i < S; ++i) {
            if (sg[i].y == 0) {  // an empty entry: its row is never written
                for (int h = 0; h < HEADS * HD; ++h)
                    if (out[(size_t)i * HEADS * HD + h] != -12345.0f) {
                        ++fails;
                        printf("form %d: empty entry %d's row was written\n", form, i);
                        break;
                    }
                continue;
            }
            const int n = in.segs[i].z + 1;
            bool ok = true;
            for (int h = 0; h < HEADS; ++h) {
                float want[HD];
                reference(&in.q[((size_t)i * HEADS + h) * HD], in.k.data(), in.v.data(),
                          pool_rows(in.tables.data() + (size_t)i * stride, n, h), n, want);
                ok = ok && std::memcmp(want, &out[((size_t)i * HEADS + h) * HD], sizeof(want)) == 0;
                for (int c = 0; kind >= 2 && c < ON; ++c) {  // head h's chunk of O column c
                    const size_t w0 = (size_t)c * OK + h * HD;
                    float p = 0.0f;
                    if (kind == 4) {
                        p = mma_block(want, &w8[w0]);
                    } else {
                        for (int d = 0; d < HD; ++d)
                            p = __fmaf_rn(want[d], kind == 2 ? wf[w0 + d] : (float)w8[w0 + d], p);
                    }
                    ok = ok && p == parts[((size_t)h * S + i) * ON + c];
                }
            }
            ++runs;
            if (!ok) {
                ++fails;
                printf("form %d history %d: differs\n", form, n);
            }
        }
    }
    rope_in_runs(in, lens, S, capacity, stride, gen, normal, runs, fails);
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
