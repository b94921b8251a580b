// mma_driver.cpp: cuda/linear_mma.cu, linear_mma_rows.cu and linear_mma_row1.cu run on the
// host (prelude.h, its mma a stand-in sum) against a plain spelling of the tensor-core
// order, bit for bit (tests/test_kernels_on_host.py builds it).
//
// The reference spells linear_mma.cu's order per output: mma_ref.h's block values (three
// part accumulators over the block's four mma steps, each step prelude.h's
// cru_host_mma_elem, the function the kernels' host mma calls); total = 0 + b_0 + b_1 +
// ...; times scale; residual last.
// Sweep: every tile form and rows form the wrapper builds (crucible/kernels/linear_mma.py),
// two tile forms also with the codes as bf16 (BW), at M = 1..40 (row tails inside and past
// a 16-row tile), two and three K blocks, with and without the residual. y starts as a
// sentinel, so an output the kernel fails to write shows. Then the fused rows forms
// (RMSNorm prologue against rowops_ref.h's tree, with and without the SwiGLU epilogue) on
// the three-block cases, and the one-row form (plain, with the residual and with the
// RMSNorm prologue; PB 9 holds every block, PB 2 streams the third). `descending` makes
// the reference add the block values in descending order: the negative control, which
// must fail exactly the runs of three blocks (two add the same either way).
#include "prelude.h"
#include "linear_mma.cu"
#include "linear_mma_rows.cu"
#include "linear_mma_row1.cu"
#include "mma_ref.h"
#include "rowops_ref.h"

#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

static bool descending = false;

static float reference(const float* x, const signed char* w, const float* sc, const float* res,
                       int m, int n, int N, int K) {
    const float total = ordered_sum(mma_blocks(x + (size_t)m * K, w + (size_t)n * K, K),
                                    descending);
    const float y = __fmul_rn(total, sc[n]);
    return res ? __fadd_rn(res[(size_t)m * N + n], y) : y;
}

struct Case {
    int M, N, K;
    std::vector<float> x, sc, res;
    std::vector<signed char> w;
};

static Case make(int M, int N, int K, std::mt19937& g) {
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> decade(-2.0f, 2.0f);
    Case c{M, N, K, std::vector<float>((size_t)M * K), std::vector<float>(N),
           std::vector<float>((size_t)M * N), std::vector<signed char>((size_t)N * K)};
    for (int m = 0; m < M; ++m) {  // rows over four decades: every part of the split matters
        const float s = std::pow(10.0f, decade(g));
        for (int k = 0; k < K; ++k) c.x[(size_t)m * K + k] = s * normal(g);
    }
    for (auto& v : c.w) v = (signed char)((int)(g() % 255) - 127);
    for (auto& v : c.sc) v = 0.001f + 0.02f * std::fabs(normal(g));
    for (auto& v : c.res) v = normal(g);
    return c;
}

static int compare(const Case& c, const std::vector<float>& y, bool with_res, const char* what) {
    int bad = 0;
    for (int m = 0; m < c.M; ++m)
        for (int n = 0; n < c.N; ++n) {
            const float want = reference(c.x.data(), c.w.data(), c.sc.data(),
                                         with_res ? c.res.data() : nullptr, m, n, c.N, c.K);
            bad += std::memcmp(&want, &y[(size_t)m * c.N + n], 4) != 0;
        }
    if (bad)
        printf("FAIL %s M=%d N=%d K=%d residual=%d: %d wrong\n", what, c.M, c.N, c.K,
               (int)with_res, bad);
    return bad != 0;
}

template <int MT, int NT, int WM, int WN, bool PF = false, bool BW = false>
int tile(const Case& c, bool with_res) {
    std::vector<float> y((size_t)c.M * c.N, -777.0f);
    const float* res = with_res ? c.res.data() : nullptr;
    // BW: the codes as bf16 (each code's f32 top half), as DeviceWeight.wb holds them
    std::vector<unsigned short> wb(BW ? c.w.size() : 0);
    for (size_t i = 0; i < wb.size(); ++i) {
        const float f = (float)c.w[i];
        unsigned u;
        std::memcpy(&u, &f, 4);
        wb[i] = (unsigned short)(u >> 16);
    }
    const signed char* w = BW ? reinterpret_cast<const signed char*>(wb.data()) : c.w.data();
    dim3 grid{(unsigned)(c.N / (8 * NT * WN)), (unsigned)((c.M + 16 * MT * WM - 1) / (16 * MT * WM)), 1};
    run_grid(grid, {(unsigned)(32 * WM * WN), 1, 1}, [&] {
        linear_mma<MT, NT, WM, WN, false, PF, BW>(c.x.data(), w, c.sc.data(), res, y.data(),
                                                  c.M, c.N, c.K);
    });
    char what[64];
    snprintf(what, sizeof what, "tile %dx%dx%dx%d%s%s", MT, NT, WM, WN, PF ? " prefetch" : "",
             BW ? " bf16 codes" : "");
    return compare(c, y, with_res, what);
}

template <int NT>
int rows(const Case& c, bool with_res, int warps) {
    std::vector<float> y((size_t)c.M * c.N, -777.0f);
    const float* res = with_res ? c.res.data() : nullptr;
    dim3 grid{(unsigned)(c.N / (8 * NT)), (unsigned)((c.M + 15) / 16), 1};
    run_grid(grid, {(unsigned)(32 * std::min(warps, c.K / 64)), 1, 1}, [&] {
        linear_mma_rows<NT, false, false, false>(c.x.data(), c.w.data(), c.sc.data(), res,
                                                 y.data(), c.M, c.N, c.K, nullptr, 0.0f);
    });
    char what[64];
    snprintf(what, sizeof what, "rows %dx%d", NT, warps);
    return compare(c, y, with_res, what);
}

// The fused rows forms: x normalised by rowops_ref.h's tree (norm weight nw, eps 1e-5;
// NORM) or as it is, then the plain reference; with SwiGLU, y[m, f] = swiglu(ref(f),
// ref(N/2 + f)).
template <int NT, bool NORM, bool EPI>
int fused(const Case& c, bool with_res, int warps) {
    const int F = c.N / 2, W = EPI ? F : c.N;
    const float* res = with_res && !EPI ? c.res.data() : nullptr;
    std::vector<float> nw(c.K), xn((size_t)c.M * c.K), y((size_t)c.M * W, -777.0f);
    for (int k = 0; k < c.K; ++k) nw[k] = 0.5f + 0.01f * (float)(k % 37);
    for (int m = 0; m < c.M; ++m) {
        const float inv = inv_rms(&c.x[(size_t)m * c.K], c.K, 1e-5f);
        for (int k = 0; k < c.K; ++k)
            xn[(size_t)m * c.K + k] = NORM ? cru_norm_apply(c.x[(size_t)m * c.K + k], inv, nw[k])
                                           : c.x[(size_t)m * c.K + k];
    }
    dim3 grid{(unsigned)(c.N / (8 * NT)), (unsigned)((c.M + 15) / 16), 1};
    run_grid(grid, {(unsigned)(32 * std::min(warps, c.K / 64)), 1, 1}, [&] {
        linear_mma_rows<NT, false, NORM, EPI>(c.x.data(), c.w.data(), c.sc.data(), res,
                                              y.data(), c.M, c.N, c.K,
                                              NORM ? nw.data() : nullptr, 1e-5f);
    });
    int bad = 0;
    for (int m = 0; m < c.M; ++m)
        for (int n = 0; n < W; ++n) {
            auto ref = [&](int col) {
                return reference(xn.data(), c.w.data(), c.sc.data(), res, m, col, c.N, c.K);
            };
            const float want = EPI ? cru_swiglu(ref(n), ref(F + n)) : ref(n);
            bad += std::memcmp(&want, &y[(size_t)m * W + n], 4) != 0;
        }
    if (bad)
        printf("FAIL fused rows %dx%d %s M=%d K=%d residual=%d: %d wrong\n", NT, warps,
               !NORM ? "swiglu" : EPI ? "norm+swiglu" : "norm", c.M, c.K, (int)(res != nullptr),
               bad);
    return bad != 0;
}

// The one-row form (linear_mma.py's launch: 256 threads, a warp per 16 columns), plain or
// with the RMSNorm prologue (x normalised by rowops_ref.h's tree, then the plain reference).
template <int PB, bool NORM>
int row1(const Case& c, bool with_res) {
    const float* res = with_res ? c.res.data() : nullptr;
    std::vector<float> nw(c.K), xn(c.x.begin(), c.x.begin() + c.K), y(c.N, -777.0f);
    for (int k = 0; k < c.K; ++k) nw[k] = 0.5f + 0.01f * (float)(k % 37);
    if (NORM) {
        const float inv = inv_rms(c.x.data(), c.K, 1e-5f);
        for (int k = 0; k < c.K; ++k) xn[k] = cru_norm_apply(c.x[k], inv, nw[k]);
    }
    run_grid({(unsigned)((c.N / 16 + 7) / 8), 1, 1}, {256, 1, 1}, [&] {
        linear_mma_row1<PB, NORM>(c.x.data(), c.w.data(), c.sc.data(), res, y.data(), c.N,
                                  c.K, NORM ? nw.data() : nullptr, 1e-5f);
    });
    int bad = 0;
    for (int n = 0; n < c.N; ++n) {
        const float want = reference(xn.data(), c.w.data(), c.sc.data(), res, 0, n, c.N, c.K);
        bad += std::memcmp(&want, &y[n], 4) != 0;
    }
    if (bad)
        printf("FAIL row1 PB=%d%s K=%d residual=%d: %d wrong\n", PB, NORM ? " norm" : "", c.K,
               (int)with_res, bad);
    return bad != 0;
}

static int all_fused(const Case& c, bool r) {
    return fused<1, true, false>(c, r, 12) + fused<2, true, false>(c, r, 8) +
           fused<2, true, true>(c, r, 12) + fused<4, true, true>(c, r, 8) +
           fused<2, false, true>(c, r, 12) + fused<4, false, true>(c, r, 8);
}

template <bool PF>
static int all_tiles(const Case& c, bool r) {
    return tile<1, 2, 2, 2, PF>(c, r) + tile<1, 2, 1, 4, PF>(c, r) + tile<1, 4, 2, 2, PF>(c, r) +
           tile<2, 2, 2, 2, PF>(c, r) + tile<2, 4, 2, 2, PF>(c, r) + tile<1, 1, 4, 2, PF>(c, r) +
           tile<4, 2, 1, 4, PF>(c, r) + tile<2, 4, 4, 1, PF>(c, r) +
           tile<1, 4, 2, 2, PF, true>(c, r) + tile<2, 4, 4, 1, PF, true>(c, r);
}

static int all_rows(const Case& c, bool r) {
    return rows<1>(c, r, 8) + rows<2>(c, r, 8) + rows<4>(c, r, 8) + rows<2>(c, r, 4) +
           rows<1>(c, r, 12) + rows<2>(c, r, 12);
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 g(1);
    // (M, K, residual): K = 192 is three blocks (the control's runs), 128 two. N = 64, which
    // every form takes. Host threads are slow, so each form runs where it tells the most.
    const int tile_cases[][3] = {{40, 192, 1}, {17, 128, 0}};
    const int rows_cases[][3] = {{5, 192, 1}, {17, 192, 0}, {1, 128, 0}};
    int runs = 0, fails = 0;
    for (auto& t : tile_cases) {
        const Case c = make(t[0], 64, t[1], g);
        fails += all_tiles<false>(c, t[2] != 0) + all_tiles<true>(c, t[2] != 0);
        runs += 20;
    }
    for (auto& t : rows_cases) {
        fails += all_rows(make(t[0], 64, t[1], g), t[2] != 0);
        runs += 6;
    }
    for (auto& t : rows_cases) {  // the fused forms on the three-block cases
        if (t[1] != 192) continue;
        fails += all_fused(make(t[0], 64, t[1], g), t[2] != 0);
        runs += 6;
    }
    for (int K : {192, 128}) {  // the one-row form: N = 160 is 10 warps, one CTA partly idle
        const Case c = make(1, 160, K, g);
        fails += row1<9, false>(c, false) + row1<9, false>(c, true) + row1<2, false>(c, true) +
                 row1<9, true>(c, false) + row1<2, true>(c, true);
        runs += 5;
    }
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
