// rowops_ref.h: plain spellings of rowops.cuh's row stages for the host drivers
// (stack_driver.cpp, mma_driver.cpp), so each driver checks its kernel against one
// reference of the RMSNorm tree instead of its own copy. Include after prelude.h and a
// kernel source (cru_inv_rms comes from rowops.cuh).
#pragma once

#include <cmath>

// rowops.cuh's RMSNorm tree, spelled out: 256 lanes of strided fma chains, each warp's
// shuffle-down tree (16, 8, 4, 2, 1), the 8 warp partials ascending.
static float inv_rms(const float* x, int K, float eps) {
    float lanes[256];
    for (int j = 0; j < 256; ++j) {
        float acc = 0.0f;
        for (int d = j; d < K; d += 256) acc = std::fma(x[d], x[d], acc);
        lanes[j] = acc;
    }
    float warp[8];
    for (int w = 0; w < 8; ++w) {
        float v[32];
        for (int l = 0; l < 32; ++l) v[l] = lanes[w * 32 + l];
        for (int off = 16; off > 0; off >>= 1)
            for (int l = 0; l < 32; ++l) v[l] = l + off < 32 ? __fadd_rn(v[l], v[l + off]) : v[l];
        warp[w] = v[0];
    }
    float ss = warp[0];
    for (int w = 1; w < 8; ++w) ss = __fadd_rn(ss, warp[w]);
    return cru_inv_rms(ss, K, eps);
}
