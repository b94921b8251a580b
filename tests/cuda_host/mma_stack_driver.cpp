// mma_stack_driver.cpp: cuda/decode_stack.cu's MMA form (decode_mlp<signed char, true>) and
// combine_rows run on the host (prelude.h, its mma a stand-in sum) against a plain spelling
// of the tensor-core order, bit for bit (tests/test_kernels_on_host.py builds it).
//
// Why a driver of its own: the MMA form hands on mma_row.cuh's block values instead of fma
// chains, through fragments, tiles and a staged slice that stack_driver.cpp's fma
// reference never sees. The reference (mlp_ref.h's, with this order's GEMM and down
// partial): h = x + O's partials (O's residual epilogue), the
// canonical RMSNorm tree (rowops_ref.h), gate/up as mma_ref.h's block values added from
// the first, times scale, SwiGLU; down's partial f of column n is the block value of the
// SwiGLU outputs f*64 .. f*64+63 against down's codes of that block (unscaled); then
// combine_rows (h + the down partials ascending, times down's scale). The stand-in mma is
// the same function in kernel and reference, so this checks the index arithmetic, not the
// tensor core.
// Sweep: int8, (K hidden, F) = (64, 128), (192, 256), (576, 128), down width = K, rows M =
// 1 and 2, O partials 0 / 1 / 3 / 9. Outputs start as sentinels, so a missed write shows.
// `descending` makes the reference add O's partials and gate/up's block values from the
// last: the negative control, which must fail every run with 3 or more of either (1 or 2
// add the same either way). decode_mlp_pair (a cluster of two CTAs, run_grid_cluster2)
// runs the same checks with 1 and 9 partials.
#include "prelude.h"
#include "decode_stack.cu"
#include "mma_ref.h"
#include "rowops_ref.h"
#include "mlp_ref.h"

#include <cstdio>
#include <random>
#include <vector>

static bool descending = false;

// A gate/up output: its block values from the first (decode_mlp's finisher), times scale.
static float gemm(const float* xn, const signed char* w, float sc, int K) {
    return __fmul_rn(ordered_sum(mma_blocks(xn, w, K), descending), sc);
}

static int check(int M, int K, int F, int n_parts, bool pair, std::mt19937& g) {
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> decade(-1.0f, 1.0f);
    auto codes = [&](size_t n) {
        std::vector<signed char> w(n);
        for (auto& v : w) v = (signed char)((int)(g() % 255) - 127);
        return w;
    };
    const int N_d = K, n_f = F / 64, n_chunks = K / 64;
    std::vector<float> x((size_t)M * K), parts((size_t)n_parts * M * K), o_sc(K), nw(K),
        gu_sc(2 * F), d_sc(N_d);
    for (auto* v : {&x, &nw}) for (auto& e : *v) e = normal(g);
    // O's partials as an int8 GEMM leaves them (unscaled: ~100s), over two decades, so that
    // three of them added in another order differ in h, not only below x's last bit.
    for (auto& e : parts) e = 100.0f * std::pow(10.0f, decade(g)) * normal(g);
    for (auto* v : {&o_sc, &gu_sc, &d_sc})
        for (auto& e : *v) e = 0.01f * std::fabs(normal(g)) + 1e-3f;
    const std::vector<signed char> w_gu = codes((size_t)2 * F * K), w_d = codes((size_t)N_d * F);
    std::vector<float> h((size_t)M * K, -777.0f), dparts((size_t)n_f * M * N_d, NAN),
        y((size_t)M * K, -777.0f);
    const float eps = 1e-5f;
    // decode_stack.py's launch: grid (F/64, M), block (32, 2 * K/64).
    auto mlp = [&] {
        (pair ? decode_mlp_pair<signed char, true> : decode_mlp<signed char, true>)(
            x.data(), n_parts ? parts.data() : nullptr, n_parts, o_sc.data(), h.data(),
            nw.data(), eps, w_gu.data(), gu_sc.data(), w_d.data(), dparts.data(), M, K, F, N_d);
    };
    // decode_stack.py's launches: grid (F/64, M), block (32, 2 K/64); the pair's (2 F/64,
    // M) in clusters of two, block (32, K/64).
    if (pair)
        run_grid_cluster2({(unsigned)(2 * n_f), (unsigned)M, 1}, {32, (unsigned)n_chunks, 1},
                          mlp);
    else
        run_grid({(unsigned)n_f, (unsigned)M, 1}, {32, (unsigned)(2 * n_chunks), 1}, mlp);
    run_grid({(unsigned)M, 1, 1}, {256, 1, 1}, [&] {
        combine_rows<signed char>(h.data(), dparts.data(), n_f, d_sc.data(), y.data(), M, K);
    });
    const MlpRun<signed char> run{M, K, F, n_parts, eps, x.data(), parts.data(), o_sc.data(),
                                  nw.data(), gu_sc.data(), d_sc.data(), w_gu.data(),
                                  w_d.data(), h.data(), dparts.data(), y.data()};
    const int bad = mlp_mismatches(run, descending, gemm, mma_block);
    if (bad)
        printf("FAIL mma%s M=%d K=%d F=%d parts=%d: %d wrong\n", pair ? " pair" : "", M, K,
               F, n_parts, bad);
    return bad != 0;
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 g(5);
    int runs = 0, fails = 0;
    // (K, F) pairs rather than their product: K = 576 (the default model's, 576 threads a
    // CTA) dominates the host run's time, and each pair still covers 1 and 2 rows and every
    // partial count.
    const int shapes[3][2] = {{64, 128}, {192, 256}, {576, 128}};
    for (const auto& kf : shapes)
        for (int M : {1, 2})
            for (int parts : {0, 1, 3, 9})
                for (bool pair : {false, true}) {  // the pair (decode_mlp_pair): 1 and 9
                    if (pair && (parts == 0 || parts == 3)) continue;
                    fails += check(M, kf[0], kf[1], parts, pair, g);
                    ++runs;
                }
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
