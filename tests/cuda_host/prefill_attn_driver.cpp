// prefill_attn_driver.cpp: cuda/attention.cu's exact tiled family (attn_exact<Q, KT, CACHE>:
// the prefill and mixed steps' attention) run on the host (prelude.h) against the plain
// spelling of the reference attention order in attn_ref.h, bit for bit
// (tests/test_kernels_on_host.py builds it).
//
// Sweep: exact-q4-k64 (the default), -q2-k32, -q1-k16, q4-k64 with the page-table cache and
// q4-k64's prefetching instance (attn_exact_pf: 384 threads, so group 3),
// 9 query heads over 3 KV heads (the default model's), one launch over seven segments as
// the scheduler packs them: prefill chunks of 4 to 70 rows starting anywhere (0, 5, 100,
// 127), decode rows (at 0, 299 and 600), so rows end inside and across K tiles and pages;
// pages shuffled, two layers (layer 1 read). A run is one (variant, segment): 35.
// `descending` as the first argument makes the reference's PV chain run in descending
// history order: the negative control, which must fail every run whose rows have two
// positions or more (30 of 35; the decode row at 0 has one).
#include "prelude.h"
#include "attention.cu"
#include "attn_ref.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 gen(9);
    std::normal_distribution<float> normal;
    // (absolute start, rows): each segment's row r sits at position start + r
    const std::vector<std::pair<int, int>> slices = {{0, 37}, {0, 1}, {100, 33}, {299, 1},
                                                     {5, 4}, {127, 70}, {600, 1}};
    const int S = (int)slices.size();
    int T = 0, max_end = 0, n_pages = 0, max_chunk = 0;
    for (auto [st, n] : slices) {
        T += n;
        max_end = std::max(max_end, st + n);
        n_pages += (st + n + 15) / 16;
        max_chunk = std::max(max_chunk, n);
    }
    const int capacity = (max_end + 255) / 256 * 256, stride = (max_end + 15) / 16;
    AttnInputs in = attn_inputs(n_pages, T, S, stride, gen, normal);
    for (int i = 0, row = 0; i < S; ++i) {
        const auto [st, n] = slices[i];
        in.segs[i] = make_int4(row, n, st, i);
        in.take_pages(i, (st + n + 15) / 16);
        row += n;
    }
    int runs = 0, fails = 0;
    const char* names[] = {"exact-q4-k64", "exact-q2-k32", "exact-q1-k16", "exact-q4-k64-cache",
                           "exact-q4-k64 prefetching"};
    for (int form = 0; form < 5; ++form) {
        const int Q = form == 1 ? 2 : form == 2 ? 1 : 4;
        std::vector<float> out(in.q.size(), -12345.0f);  // a sentinel: a missed write shows
        auto launch = [&] {
            const float *qq = in.q.data(), *k = in.k.data(), *v = in.v.data();
            const int* t = in.tables.data();
            const int4* sg = in.segs.data();
            float* o = out.data();
            switch (form) {
                case 0: attn_exact<4, 64, false>(qq, k, v, sg, t, stride, o, HEADS, KV,
                                                 LAYERS, LAYER, capacity); break;
                case 1: attn_exact<2, 32, false>(qq, k, v, sg, t, stride, o, HEADS, KV,
                                                 LAYERS, LAYER, capacity); break;
                case 2: attn_exact<1, 16, false>(qq, k, v, sg, t, stride, o, HEADS, KV,
                                                 LAYERS, LAYER, capacity); break;
                case 3: attn_exact<4, 64, true>(qq, k, v, sg, t, stride, o, HEADS, KV,
                                                LAYERS, LAYER, capacity); break;
                default: attn_exact_pf(qq, k, v, sg, t, stride, o, HEADS, KV, LAYERS, LAYER,
                                       capacity);
            }
        };
        run_grid(dim3{(unsigned)KV, (unsigned)((max_chunk + Q - 1) / Q), (unsigned)S},
                 dim3{(unsigned)(32 * Q * (HEADS / KV)), 1, 1}, launch);
        for (int i = 0; i < S; ++i) {
            const int4 sd = in.segs[i];
            bool ok = true;
            for (int r = 0; r < sd.y; ++r) {
                const int n = sd.z + r + 1, row = sd.x + r;
                for (int h = 0; h < HEADS; ++h) {
                    float want[HD];
                    reference(&in.q[((size_t)row * HEADS + h) * HD], in.k.data(), in.v.data(),
                              pool_rows(in.tables.data() + (size_t)i * stride, n, h), n, want);
                    ok = ok && std::memcmp(want, &out[((size_t)row * HEADS + h) * HD],
                                           sizeof(want)) == 0;
                }
            }
            ++runs;
            if (!ok) {
                ++fails;
                printf("%s segment %d (%d rows from %d): differs\n", names[form], i, sd.y, sd.z);
            }
        }
    }
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
