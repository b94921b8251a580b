// stack_driver.cpp: cuda/decode_stack.cu (decode_mlp, combine_rows) run on the host
// (prelude.h) against a plain spelling of the five-kernel layer's order, bit for bit
// (tests/test_kernels_on_host.py builds it; the reference is mlp_ref.h's).
//
// Sweep: f32 and int8, K (hidden) 64 / 192 / 576, F 128 / 256, down width = K, rows M = 1
// and 2, O partials 0 / 1 / 3 / 9. Checked: decode_mlp's h (x + O's partials finished as
// O's residual epilogue), its down partials (the chunk-f chain of down over SwiGLU
// outputs f*64 .. f*64+63, after the canonical RMSNorm tree and gate/up), and combine_rows
// (h + the down partials, ascending). Outputs start as sentinels, so a missed write shows.
// `descending` as the first argument makes the reference add O's partials in descending
// order: the negative control, which must report failures (every run with 3 or 9 partials).
// decode_mlp_pair (a cluster of two CTAs, run_grid_cluster2) runs the same checks with 3
// and 9 partials.
#include "prelude.h"
#include "decode_stack.cu"
#include "rowops_ref.h"
#include "mlp_ref.h"

#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

static bool descending = false;

// A GEMM output in the canonical order: chunk chains from 0, ascending, then the scale.
template <typename T>
float dot(const float* x, const T* w, float sc, int K) {
    float total = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 64) {
        float p = 0.0f;
        for (int k = k0; k < std::min(K, k0 + 64); ++k) p = std::fma(x[k], (float)w[k], p);
        total = k0 == 0 ? p : __fadd_rn(total, p);
    }
    return sizeof(T) == 1 ? __fmul_rn(total, sc) : total;
}

template <typename T>
int check(int M, int K, int F, int n_parts, bool pair, std::mt19937& g) {
    std::normal_distribution<float> normal;
    auto weights = [&](size_t n) {
        std::vector<T> w(n);
        for (auto& v : w) v = sizeof(T) == 1 ? (T)((int)(g() % 255) - 127) : (T)(0.05f * normal(g));
        return w;
    };
    const bool i8 = sizeof(T) == 1;
    const int N_d = K, n_f = F / 64;
    std::vector<float> x((size_t)M * K), parts((size_t)n_parts * M * K), o_sc(K), nw(K),
        gu_sc(2 * F), d_sc(N_d);
    std::uniform_real_distribution<float> decade(-1.0f, 1.0f);
    for (auto* v : {&x, &nw}) for (auto& e : *v) e = normal(g);
    // O's partials over two decades (int8: unscaled, ~100s), so that three of them added in
    // another order differ in h, not only below x's last bit: the negative control's runs
    // with 3 or 9 partials all fail, whatever the draw.
    for (auto& e : parts) e = (i8 ? 100.0f : 1.0f) * std::pow(10.0f, decade(g)) * normal(g);
    for (auto* v : {&o_sc, &gu_sc, &d_sc}) for (auto& e : *v) e = 0.01f * std::fabs(normal(g)) + 1e-3f;
    std::vector<T> w_gu = weights((size_t)2 * F * K), w_d = weights((size_t)N_d * F);
    std::vector<float> h((size_t)M * K, -777.0f), dparts((size_t)n_f * M * N_d, NAN),
        y((size_t)M * K, -777.0f);
    const float eps = 1e-5f;
    const int chunks = (K + 63) / 64;
    auto mlp = [&] {
        (pair ? decode_mlp_pair<T> : decode_mlp<T>)(
            x.data(), n_parts ? parts.data() : nullptr, n_parts, i8 ? o_sc.data() : nullptr,
            h.data(), nw.data(), eps, w_gu.data(), i8 ? gu_sc.data() : nullptr, w_d.data(),
            dparts.data(), M, K, F, N_d);
    };
    // decode_stack.py's launches: grid (F/64, M), block (32, 2 K/64); the pair's (2 F/64,
    // M) in clusters of two, block (32, K/64).
    if (pair)
        run_grid_cluster2({(unsigned)(2 * n_f), (unsigned)M, 1}, {32, (unsigned)chunks, 1}, mlp);
    else
        run_grid({(unsigned)n_f, (unsigned)M, 1}, {32, (unsigned)(2 * chunks), 1}, mlp);
    run_grid({(unsigned)M, 1, 1}, {256, 1, 1}, [&] {
        combine_rows<T>(h.data(), dparts.data(), n_f, i8 ? d_sc.data() : nullptr, y.data(), M, K);
    });
    const MlpRun<T> run{M, K, F, n_parts, eps, x.data(), parts.data(), o_sc.data(), nw.data(),
                        gu_sc.data(), d_sc.data(), w_gu.data(), w_d.data(), h.data(),
                        dparts.data(), y.data()};
    // Down's partial in linear.cu's order: the chunk's fma chain from 0.
    auto chain = [](const float* act, const T* w) {
        float acc = 0.0f;
        for (int a = 0; a < 64; ++a) acc = std::fma(act[a], (float)w[a], acc);
        return acc;
    };
    const int bad = mlp_mismatches(run, descending, dot<T>, chain);
    if (bad)
        printf("FAIL %s%s M=%d K=%d F=%d parts=%d: %d wrong\n", i8 ? "int8" : "f32",
               pair ? " pair" : "", M, K, F, n_parts, bad);
    return bad != 0;
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 g(3);
    int runs = 0, fails = 0;
    for (int K : {64, 192, 576})
        for (int F : {128, 256})
            for (int M : {1, 2})
                for (int parts : {0, 1, 3, 9})
                    for (bool pair : {false, true}) {  // the pair: with 3 and 9 partials
                        if (pair && parts < 3) continue;
                        fails += check<float>(M, K, F, parts, pair, g) +
                                 check<signed char>(M, K, F, parts, pair, g);
                        runs += 2;
                    }
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
