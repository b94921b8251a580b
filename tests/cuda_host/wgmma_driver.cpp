// wgmma_driver.cpp: cuda/linear_wgmma.cu and bench/wgmma_gemm.cu (linear_mma.cu's order on
// the warpgroup MMA; the first with its loads through a cp.async pipeline from the codes
// pre-permuted into wgmma's shared-memory image, the second through registers) run on the host (prelude.h, wgmma_host.h's
// stand-ins, descriptor mode 0) against mma_ref.h's spelling of the order, bit for bit
// (tests/test_kernels_on_host.py builds it).
//
// Sweep: wgmma_gemm at BN 32 and 64, linear_wgmma at (BN, stages) (16, 4), (32, 3), (32, 4),
// (64, 3) and its SwiGLU epilogue at (32, 3) and (64, 3) (M 1, 63, 65, 100; K 64 and 192),
// linear_wgmma_rows at (BN, warpgroups) (16, 3) and (16, 2), whose warpgroups take
// the K blocks in turn (one block: the others idle; three over two: uneven; and seven blocks,
// K = 448, at M 7 and 100);
// M = 1, 7, 63, 64, 65, 100 (row tails in and past a 64-row tile,
// two CTAs down M); N = 2 BN (two CTAs across); K = 64, 128, 192 (one to three blocks, so
// the double buffer turns over); with and without the residual. y starts as a sentinel, so
// an output the kernel fails to write shows. `descending` makes the reference add the block
// values in descending order: the negative control, which must fail exactly the runs of
// three blocks (two add the same either way).
#include "prelude.h"
#include "wgmma_host.h"
#include "linear_wgmma.cu"
#include "linear_wgmma_rows.cu"
#include "../../bench/wgmma_gemm.cu"
#include "mma_ref.h"

#include <cstdio>
#include <string>
#include <random>
#include <vector>

static bool descending = false;

// linear_wgmma.cu's wp: element (nc, c, j, kc, r, p) = code[8 nc + r][64 c + 16 (p / 2)
// + 4 j + p % 2 + 2 kc], as bf16 (kernels/device_weight.py codes_wgmma builds the same).
static std::vector<unsigned short> codes_wgmma(const std::vector<unsigned short>& wb, int N,
                                               int K) {
    std::vector<unsigned short> out(wb.size());
    size_t i = 0;
    for (int nc = 0; nc < N / 8; ++nc)
        for (int c = 0; c < K / 64; ++c)
            for (int j = 0; j < 4; ++j)
                for (int kc = 0; kc < 2; ++kc)
                    for (int r = 0; r < 8; ++r)
                        for (int p = 0; p < 8; ++p)
                            out[i++] = wb[(size_t)(8 * nc + r) * K + 64 * c + 16 * (p / 2) +
                                          4 * j + p % 2 + 2 * kc];
    return out;
}

// BN: the CTA's columns; S: 0 for wgmma_gemm, else linear_wgmma's stages; W: warpgroups of
// linear_wgmma_rows (0: not it).
template <int BN, int S, int W = 0>
static int run_case(int M, int K, bool with_res, std::mt19937& gen) {
    const int N = 2 * BN;
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> decade(-2.0f, 2.0f);
    std::vector<float> x((size_t)M * K), sc(N), res((size_t)M * N), y((size_t)M * N, -777.0f);
    std::vector<signed char> w((size_t)N * K);
    for (int m = 0; m < M; ++m) {
        const float s = std::pow(10.0f, decade(gen));
        for (int k = 0; k < K; ++k) x[(size_t)m * K + k] = s * normal(gen);
    }
    for (auto& v : w) v = (signed char)((int)(gen() % 255) - 127);
    for (auto& v : sc) v = 0.001f + 0.02f * std::fabs(normal(gen));
    for (auto& v : res) v = normal(gen);
    const std::vector<unsigned short> wb = codes_bf16(w);
    const float* r = with_res ? res.data() : nullptr;
    const std::vector<unsigned short> wp = codes_wgmma(wb, N, K);
    run_grid({(unsigned)(N / BN), (unsigned)((M + 63) / 64), 1}, {128 * (W ? W : 1), 1, 1}, [&] {
        if constexpr (W > 0)
            linear_wgmma_rows_body<BN, W>(x.data(), wp.data(), sc.data(), r, y.data(), M, N, K, 0);
        else if constexpr (S == 0)
            wgmma_gemm_body<BN>(x.data(), reinterpret_cast<const uint16_t*>(wb.data()),
                                sc.data(), r, y.data(), M, N, K, 0);
        else
            linear_wgmma_body<BN, S>(x.data(), wp.data(), sc.data(), r, y.data(), M, N, K, 0);
    });
    int bad = 0;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            const float total = ordered_sum(mma_blocks(&x[(size_t)m * K], &w[(size_t)n * K], K),
                                            descending);
            const float v = __fmul_rn(total, sc[n]);
            const float want = r ? __fadd_rn(r[(size_t)m * N + n], v) : v;
            bad += std::memcmp(&want, &y[(size_t)m * N + n], 4) != 0;
        }
    if (bad)
        printf("FAIL %s BN=%d M=%d K=%d residual=%d: %d wrong\n",
               W ? "linear_wgmma_rows" : S ? "linear_wgmma" : "gemm", BN, M,
               K, (int)with_res, bad);
    return bad != 0;
}

// linear_wgmma's SwiGLU epilogue (EPI): w is gate/up [2F, K] with F = BN (two CTAs across,
// each taking BN / 2 gate columns and their up columns), y [M, F] = swiglu(gate * scale[f],
// up * scale[F + f]) (rowops.cuh's cru_swiglu), the plain GEMM's values through swiglu_rows.
template <int BN, int S>
static int run_swiglu(int M, int K, std::mt19937& gen) {
    const int F = BN, N = 2 * F;
    std::normal_distribution<float> normal;
    std::vector<float> x((size_t)M * K), sc(N), y((size_t)M * F, -777.0f);
    std::vector<signed char> w((size_t)N * K);
    for (auto& v : x) v = normal(gen);
    for (auto& v : w) v = (signed char)((int)(gen() % 255) - 127);
    for (auto& v : sc) v = 0.001f + 0.02f * std::fabs(normal(gen));
    const std::vector<unsigned short> wp = codes_wgmma(codes_bf16(w), N, K);
    run_grid({(unsigned)(N / BN), (unsigned)((M + 63) / 64), 1}, {128, 1, 1}, [&] {
        linear_wgmma_body<BN, S, true>(x.data(), wp.data(), sc.data(), nullptr, y.data(), M, N,
                                       K, 0);
    });
    int bad = 0;
    for (int m = 0; m < M; ++m)
        for (int f = 0; f < F; ++f) {
            const float* xm = &x[(size_t)m * K];
            const float g = ordered_sum(mma_blocks(xm, &w[(size_t)f * K], K), descending);
            const float u = ordered_sum(mma_blocks(xm, &w[(size_t)(F + f) * K], K), descending);
            const float want = cru_swiglu(__fmul_rn(g, sc[f]), __fmul_rn(u, sc[F + f]));
            bad += std::memcmp(&want, &y[(size_t)m * F + f], 4) != 0;
        }
    if (bad) printf("FAIL linear_wgmma swiglu BN=%d M=%d K=%d: %d wrong\n", BN, M, K, bad);
    return bad != 0;
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::string(argv[1]) == "descending";
    std::mt19937 gen(7);
    int runs = 0, failed = 0;
    for (int M : {1, 7, 63, 64, 65, 100})
        for (int K : {64, 128, 192})
            for (bool with_res : {false, true}) {
                failed += run_case<32, 0>(M, K, with_res, gen) + run_case<64, 0>(M, K, with_res, gen);
                failed += run_case<32, 3>(M, K, with_res, gen) + run_case<32, 4>(M, K, with_res, gen);
                failed += run_case<64, 3>(M, K, with_res, gen) + run_case<16, 4>(M, K, with_res, gen);
                failed += run_case<16, 0, 3>(M, K, with_res, gen) + run_case<16, 0, 2>(M, K, with_res, gen);
                runs += 8;
            }
    for (int M : {7, 100})  // the rows kernel over seven blocks: 3, 2, 2 and 4, 3 a warpgroup
        for (bool with_res : {false, true}) {
            failed += run_case<16, 0, 3>(M, 448, with_res, gen) + run_case<16, 0, 2>(M, 448, with_res, gen);
            runs += 2;
        }
    for (int M : {1, 63, 65, 100})  // the SwiGLU epilogue: one and three blocks
        for (int K : {64, 192}) {
            failed += run_swiglu<32, 3>(M, K, gen) + run_swiglu<64, 3>(M, K, gen);
            runs += 2;
        }
    printf("%d runs, %d failed\n", runs, failed);
    return failed ? 1 : 0;
}
