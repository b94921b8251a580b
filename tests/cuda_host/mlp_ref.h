// mlp_ref.h: the reference the decode-stack drivers (stack_driver.cpp: linear.cu's order;
// mma_stack_driver.cpp: the tensor-core order) hold decode_mlp and combine_rows to, spelled
// once. The two orders differ only in how a GEMM output and a down partial are formed, so
// those come in as functions; the rest of the MLP is the same in both:
//   h = x + O's partials finished as O's residual epilogue (cru_combined), the canonical
//   RMSNorm tree (rowops_ref.h), SwiGLU of gate/up, down's partial f of column n over the
//   SwiGLU outputs f*64 .. f*64+63, and combine_rows: h + the down partials, ascending.
// Include after prelude.h, a kernel source and rowops_ref.h.
#pragma once

#include <cstring>
#include <vector>

#include "mma_ref.h"  // ordered_sum

// base + (p_0 + p_1 + ...) (* scale for int8), the partials from the first or, for a
// negative control, from the last.
template <typename T>
float combine(float base, const std::vector<float>& p, float sc, bool desc) {
    if (p.empty()) return base;
    const float t = ordered_sum(p, desc);
    return __fadd_rn(base, sizeof(T) == 1 ? __fmul_rn(t, sc) : t);
}

// What one decode_mlp + combine_rows launch read and wrote ([M][K] rows, partials
// [n][M][width]); the drivers fill it and run the kernels on it.
template <typename T>
struct MlpRun {
    int M, K, F, n_parts;
    float eps;
    const float *x, *parts, *o_sc, *nw, *gu_sc, *d_sc;
    const T *w_gu, *w_d;
    const float *h, *dparts, *y;  // the kernels' outputs
};

// Wrong elements of h, the down partials and y. gemm(xn, w_row, scale, K): a gate or up
// output; part(act64, w64): down's partial over one 64-block of SwiGLU outputs.
// desc_o: O's partials added from the last (the negative control).
template <typename T, typename Gemm, typename Part>
int mlp_mismatches(const MlpRun<T>& r, bool desc_o, Gemm gemm, Part part) {
    const int K = r.K, F = r.F, M = r.M, N_d = K, n_f = F / 64;
    auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
    int bad = 0;
    for (int m = 0; m < M; ++m) {
        std::vector<float> hr(K), xn(K), act(F);
        for (int k = 0; k < K; ++k) {
            std::vector<float> p;
            for (int c = 0; c < r.n_parts; ++c) p.push_back(r.parts[((size_t)c * M + m) * K + k]);
            hr[k] = combine<T>(r.x[(size_t)m * K + k], p, r.o_sc[k], desc_o);
            bad += !same(hr[k], r.h[(size_t)m * K + k]);
        }
        const float inv = inv_rms(hr.data(), K, r.eps);
        for (int k = 0; k < K; ++k) xn[k] = cru_norm_apply(hr[k], inv, r.nw[k]);
        for (int a = 0; a < F; ++a)
            act[a] = cru_swiglu(gemm(xn.data(), &r.w_gu[(size_t)a * K], r.gu_sc[a], K),
                                gemm(xn.data(), &r.w_gu[(size_t)(F + a) * K], r.gu_sc[F + a], K));
        for (int n = 0; n < N_d; ++n) {
            std::vector<float> p;
            for (int f = 0; f < n_f; ++f) {
                p.push_back(part(&act[64 * f], &r.w_d[(size_t)n * F + 64 * f]));
                bad += !same(p.back(), r.dparts[((size_t)f * M + m) * N_d + n]);
            }
            bad += !same(combine<T>(hr[n], p, r.d_sc[n], false), r.y[(size_t)m * K + n]);
        }
    }
    return bad;
}
