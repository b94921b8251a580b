// mma_qkv_driver.cpp: cuda/linear_rows.cu's MMA form (linear_rows<signed char, 1, 1, 2,
// true>: the decode stack's one-row int8 RMSNorm + QKV + RoPE + K/V store under the
// tensor-core order) run on the host (prelude.h, its mma a stand-in sum) against a plain
// spelling of that order, bit for bit (tests/test_kernels_on_host.py builds it).
//
// Why: the form's blocks land where the fma form's chains go, through tiles, fragments and
// the finisher's part[] indexing; a slip there puts a right value in the wrong column. The
// reference: x staged as the prologue stages it (x itself; x + the previous GEMM's
// partials, ascending, times its scales; or an embedding row picked by ids/feed/fed), the
// canonical RMSNorm tree (rowops_ref.h), each of the head's 64 columns as mma_ref.h's block
// values added from the first, times scale; Q and K heads rotated (rowops.cuh's cru_rope
// of columns j, j + 32), V copied; Q to q_out, K and V into small pools at (page, slot) of
// the layer. Every element of q_out, both pools and x_out is compared, all starting as
// sentinels, so a missed write or a write to the wrong place shows.
// Sweep: K 64 / 192 / 576, rows 1 and 2, prologue none / 1 / 3 partials / gather, column
// blocks per CTA 1 or 3 (the LM head's groups path; 3 leaves a short last CTA). `descending`
// makes the reference add the partials and the block values from the last: the negative
// control, which must fail every run with 3 or more of either.
#include "prelude.h"
#include "linear_rows.cu"
#include "mma_ref.h"
#include "rowops_ref.h"

#include <cstdio>
#include <random>
#include <vector>

static bool descending = false;

constexpr int H = 4, NKV = 2, HEADS = H + 2 * NKV, PAGES = 3, LAYERS = 2, LAYER = 1,
              POS = 8, V = 5, KV_DIM = NKV * 64;

enum Prologue { NONE, ONE_PART, THREE_PARTS, GATHER };

static int check(int M, int K, Prologue pro, int groups, std::mt19937& g) {
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f), decade(-1.0f, 1.0f);
    const int N = HEADS * 64, n_chunks = K / 64;
    const int n_parts = pro == ONE_PART ? 1 : pro == THREE_PARTS ? 3 : 0;
    std::vector<float> x((size_t)(pro == GATHER ? V : M) * K), parts((size_t)n_parts * M * K),
        psc(K), nw(K), sc(N), cos_t(POS * 32), sin_t(POS * 32);
    std::vector<signed char> w((size_t)N * K);
    for (auto* v : {&x, &nw}) for (auto& e : *v) e = normal(g);
    // Partials as an int8 GEMM leaves them (unscaled), over two decades, so that three of
    // them added in another order differ in x, not only below its last bit.
    for (auto& e : parts) e = 100.0f * std::pow(10.0f, decade(g)) * normal(g);
    for (auto* v : {&psc, &sc}) for (auto& e : *v) e = 0.01f * std::fabs(normal(g)) + 1e-3f;
    for (auto* v : {&cos_t, &sin_t}) for (auto& e : *v) e = unit(g);
    for (auto& e : w) e = (signed char)((int)(g() % 255) - 127);
    // Rows' metadata: distinct (page, slot) places, positions into the RoPE tables; gather
    // rows by ids, and with 2 rows row 1 through feed/fed (embed_fed's pick).
    std::vector<int> pos(M), pages(M), slots(M), ids(M), feed{-1, 0}, fed{4};
    for (int m = 0; m < M; ++m) {
        pos[m] = (int)(g() % POS);
        pages[m] = (int)(m + g() % 2) % PAGES;
        slots[m] = (int)(g() % 8) + 8 * m;
        ids[m] = (int)(g() % V);
    }
    const size_t pool_n = (size_t)PAGES * LAYERS * 16 * KV_DIM;
    std::vector<float> q((size_t)M * H * 64, -777.0f), kp(pool_n, -777.0f), vp(pool_n, -777.0f),
        xo((size_t)M * K, -777.0f);
    const bool gather = pro == GATHER, with_out = pro != NONE;
    // linear_rows.py's launch: grid (ceil(2 heads / groups), M), block (32, max(K/64, 8))
    // (the MMA form's column blocks are half heads).
    const std::vector<unsigned short> wb = codes_bf16(w);  // what the MMA form reads
    run_grid({(unsigned)((2 * HEADS + groups - 1) / groups), (unsigned)M, 1},
             {32, (unsigned)std::max(n_chunks, 8), 1}, [&] {
        linear_rows<signed char, 1, 1, 2, true>(
            x.data(), reinterpret_cast<const signed char*>(wb.data()), sc.data(), nw.data(), 1e-5f, nullptr, q.data(), M, N, K,
            groups, pos.data(), pages.data(), slots.data(), cos_t.data(), sin_t.data(),
            kp.data(), vp.data(), LAYER, LAYERS, H, NKV, n_parts ? parts.data() : nullptr,
            n_parts, n_parts ? psc.data() : nullptr, with_out ? xo.data() : nullptr,
            gather ? ids.data() : nullptr, gather && M == 2 ? feed.data() : nullptr,
            gather && M == 2 ? fed.data() : nullptr);
    });
    std::vector<float> q_r((size_t)M * H * 64, -777.0f), kp_r(pool_n, -777.0f),
        vp_r(pool_n, -777.0f), xo_r((size_t)M * K, -777.0f);
    for (int m = 0; m < M; ++m) {
        std::vector<float> xr(K), xn(K);
        const int row = gather ? (M == 2 && feed[m] >= 0 ? fed[feed[m]] : ids[m]) : m;
        for (int k = 0; k < K; ++k) {
            std::vector<float> p;
            for (int c = 0; c < n_parts; ++c) p.push_back(parts[((size_t)c * M + m) * K + k]);
            const float base = x[(size_t)row * K + k];
            xr[k] = p.empty() ? base
                              : __fadd_rn(base, __fmul_rn(ordered_sum(p, descending), psc[k]));
            if (with_out) xo_r[(size_t)m * K + k] = xr[k];
        }
        const float inv = inv_rms(xr.data(), K, 1e-5f);
        for (int k = 0; k < K; ++k) xn[k] = cru_norm_apply(xr[k], inv, nw[k]);
        const long base = (((long)pages[m] * LAYERS + LAYER) * 16 + slots[m]) * KV_DIM;
        for (int cb = 0; cb < HEADS; ++cb) {
            float v[64];
            for (int j = 0; j < 64; ++j) {
                const int col = cb * 64 + j;
                v[j] = __fmul_rn(ordered_sum(mma_blocks(xn.data(), &w[(size_t)col * K], K),
                                             descending), sc[col]);
            }
            float* dst = cb < H ? &q_r[((size_t)m * H + cb) * 64]
                         : cb < H + NKV ? &kp_r[base + (cb - H) * 64]
                                        : &vp_r[base + (cb - H - NKV) * 64];
            for (int l = 0; l < 32; ++l) {
                const float2 r = cb < H + NKV
                                     ? cru_rope(v[l], v[l + 32], cos_t[pos[m] * 32 + l],
                                                sin_t[pos[m] * 32 + l])
                                     : make_float2(v[l], v[l + 32]);
                dst[l] = r.x;
                dst[l + 32] = r.y;
            }
        }
    }
    auto differ = [](const std::vector<float>& a, const std::vector<float>& b) {
        int n = 0;
        for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
        return n;
    };
    const int bq = differ(q, q_r), bk = differ(kp, kp_r), bv = differ(vp, vp_r),
              bx = differ(xo, xo_r);
    static const char* names[] = {"none", "1 partial", "3 partials", "gather"};
    if (bq + bk + bv + bx)
        printf("FAIL mma qkv M=%d K=%d %s groups=%d: wrong q %d, K pool %d, V pool %d, "
               "x_out %d\n", M, K, names[pro], groups, bq, bk, bv, bx);
    return bq + bk + bv + bx != 0;
}

int main(int argc, char** argv) {
    descending = argc > 1 && std::strcmp(argv[1], "descending") == 0;
    std::mt19937 g(7);
    int runs = 0, fails = 0;
    for (int K : {64, 192, 576})
        for (Prologue pro : {NONE, ONE_PART, THREE_PARTS, GATHER})
            for (int M : {1, 2}) {  // groups alternate so each prologue sees both with each M
                fails += check(M, K, pro, (pro + M) % 2 ? 3 : 1, g);
                ++runs;
            }
    printf("%d runs, %d failed\n", runs, fails);
    return fails != 0;
}
