// chunks_driver.cpp: cuda/linear_chunks.cu run on the host (prelude.h) against a plain
// spelling of the canonical order, bit for bit (tests/test_linear_chunks_host.py builds it).
//
// Sweep: every instantiation (f32/int8, NT 32/64, MR 16/32/64 picked by M as the wrapper
// does, store / store + residual / SwiGLU) over shapes with N and K tails and M = 1..64,
// and M past 64 in row blocks of 64 (gridDim.z), the last one partial.
// The scratch starts as NaN and y as a sentinel, so a partial or an output the kernel fails
// to write shows. Counters must be back at zero after every launch.
// `descending` as the first argument makes the reference add the chunk partials in
// descending order: the negative control, which must report failures.
#include "prelude.h"
#include "linear_chunks.cu"

#include <array>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

static bool descending = false;

template <typename T, int NT, int MR, int EPI>
void launch(const float* x, const T* w, const float* scale, const float* res, float* y,
            float* part, unsigned* counters, int M, int N_out, int K, int tiles, std::mt19937& g) {
    const int chunks = (K + 63) / 64, blocks = (M + MR - 1) / MR;
    gridDim = {(unsigned)tiles, (unsigned)chunks, (unsigned)blocks};
    blockDim = {256, 1, 1};
    std::vector<std::array<int, 3>> order;
    for (int b = 0; b < blocks; ++b)
        for (int c = 0; c < chunks; ++c)
            for (int j = 0; j < tiles; ++j) order.push_back({j, c, b});
    std::shuffle(order.begin(), order.end(), g);
    std::barrier<> bar(256);
    std::vector<std::thread> threads;
    for (int t = 0; t < 256; ++t)
        threads.emplace_back([&, t] {
            cta_barrier = &bar;  // thread_local (prelude.h)
            threadIdx = {(unsigned)t, 0, 0};
            for (auto [j, c, b] : order) {
                blockIdx = {(unsigned)j, (unsigned)c, (unsigned)b};
                linear_chunks<T, NT, MR, EPI>(x, w, scale, res, y, part, counters, M, N_out, K);
                bar.arrive_and_wait();  // the next CTA starts once this one has finished
            }
        });
    for (auto& t : threads) t.join();
}

// Canonical order, spelled plainly: chunk chains from 0, totals in chunk order, scale, then
// the residual or SwiGLU (rowops.cuh's one spelling).
template <typename T>
float dot(const std::vector<float>& x, const std::vector<T>& w, const std::vector<float>& sc,
          int m, int n, int K) {
    std::vector<float> parts;
    for (int k0 = 0; k0 < K; k0 += 64) {
        float p = 0.0f;
        for (int k = k0; k < std::min(K, k0 + 64); ++k)
            p = std::fma(x[(size_t)m * K + k], (float)w[(size_t)n * K + k], p);
        parts.push_back(p);
    }
    if (descending) std::reverse(parts.begin(), parts.end());
    float total = parts[0];
    for (size_t c = 1; c < parts.size(); ++c) total = __fadd_rn(total, parts[c]);
    return sizeof(T) == 1 ? __fmul_rn(total, sc[n]) : total;
}

template <typename T, int NT, int MR, int EPI>
int check(int M, int N_w, int K, bool with_res, std::mt19937& g) {
    std::normal_distribution<float> normal;
    std::vector<float> x((size_t)M * K), sc(N_w);
    std::vector<T> w((size_t)N_w * K);
    for (auto& v : x) v = normal(g);
    for (auto& v : w) v = sizeof(T) == 1 ? (T)((int)(g() % 255) - 127) : (T)normal(g);
    for (auto& v : sc) v = 0.01f * std::fabs(normal(g));
    const int N_out = EPI ? N_w / 2 : N_w, per_tile = EPI ? NT / 2 : NT;
    const int tiles = (N_out + per_tile - 1) / per_tile, chunks = (K + 63) / 64;
    std::vector<float> res((size_t)M * N_out), y((size_t)M * N_out, -777.0f);
    const int blocks = (M + MR - 1) / MR;
    std::vector<float> part((size_t)blocks * tiles * chunks * MR * NT, NAN);
    for (auto& v : res) v = normal(g);
    std::vector<unsigned> counters((size_t)blocks * tiles, 0u);
    const float* rp = (with_res && EPI == 0) ? res.data() : nullptr;
    launch<T, NT, MR, EPI>(x.data(), w.data(), sizeof(T) == 1 ? sc.data() : y.data(), rp,
                           y.data(), part.data(), counters.data(), M, N_out, K, tiles, g);
    int bad = 0;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N_out; ++n) {
            const float v = dot(x, w, sc, m, n, K);
            const float want = EPI ? cru_swiglu(v, dot(x, w, sc, m, N_out + n, K))
                                   : (rp ? __fadd_rn(rp[(size_t)m * N_out + n], v) : v);
            bad += std::memcmp(&want, &y[(size_t)m * N_out + n], 4) != 0;
        }
    for (unsigned c : counters) bad += c != 0u;
    if (bad)
        printf("FAIL %s NT=%d MR=%d EPI=%d M=%d N_w=%d K=%d residual=%d: %d wrong\n",
               sizeof(T) == 1 ? "int8" : "f32", NT, MR, EPI, M, N_w, K, (int)with_res, bad);
    return bad != 0;
}

template <typename T, int NT, int EPI>
int by_rows(int M, int N, int K, bool res, std::mt19937& g) {  // MR as chunks_mr picks it
    if (M <= 16) return check<T, NT, 16, EPI>(M, N, K, res, g);
    if (M <= 32) return check<T, NT, 32, EPI>(M, N, K, res, g);
    return check<T, NT, 64, EPI>(M, N, K, res, g);
}

template <typename T, int NT>
int sweep(std::mt19937& g, int& runs) {
    const int shapes[][2] = {{70, 112}, {96, 192}, {130, 64}, {64, 16}, {34, 80}};  // N_w, K
    int fails = 0;
    for (auto& s : shapes)
        for (int M : {1, 5, 16, 17, 31, 32, 33, 50, 64, 65, 130, 192}) {
            fails += by_rows<T, NT, 0>(M, s[0], s[1], false, g);
            fails += by_rows<T, NT, 0>(M, s[0], s[1], true, g);
            fails += by_rows<T, NT, 1>(M, s[0], s[1], false, g);
            runs += 3;
        }
    return fails;
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 g(1);
    int runs = 0;
    const int fails = sweep<float, 32>(g, runs) + sweep<float, 64>(g, runs) +
                      sweep<signed char, 32>(g, runs) + sweep<signed char, 64>(g, runs);
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
