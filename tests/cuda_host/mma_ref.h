// mma_ref.h: a plain spelling of the tensor-core GEMM order (linear_mma.cu states it) for
// the host drivers (mma_driver.cpp, mma_stack_driver.cpp, mma_qkv_driver.cpp; mlp_ref.h
// takes its ordered_sum), so every
// mma-order kernel is checked against one reference of the block value instead of each
// driver's own copy. Include after prelude.h and a kernel source (cru_split3 comes from
// mma_common.cuh, cru_host_mma_elem from prelude.h).
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

// One 64-wide K block's value: x = hi + mid + lo (cru_split3), each part's accumulator from
// 0 taking the block's four m16n8k16 steps j ascending, slot kk of step j holding k =
// 16 ((kk % 8) / 2) + 4 j + (kk % 2) + 2 (kk / 8): lane group t = (kk % 8) / 2 feeds k =
// 16 t + 4 j .. + 3, in the slots 2t, 2t+1, 2t+8, 2t+9 (mma_common.cuh's fragments). Each
// step is prelude.h's cru_host_mma_elem, the function the kernels' host mma calls, so
// kernel and reference round identically and a mismatch is an index, never a rounding.
// The value is 0 + ((lo + mid) + hi): cru_block_add from 0, as the kernels store it.
// What this cannot see: the stand-in sums a step's 16 exact products in double, so a kernel
// that permuted k within one step (x and codes alike) would still match; which k go to
// which step, block, part and column is what a mismatch here reports.
// x: the row's 64 values of the block; w: the column's 64 codes of the same block.
static float mma_block(const float* x, const signed char* w) {
    float p[3] = {0.0f, 0.0f, 0.0f};
    for (int j = 0; j < 4; ++j) {
        float a[3][16], b[16];
        for (int kk = 0; kk < 16; ++kk) {
            const int k = 16 * ((kk % 8) / 2) + 4 * j + (kk % 2) + 2 * (kk / 8);
            cru_split3(x[k], a[0][kk], a[1][kk], a[2][kk]);
            b[kk] = (float)w[k];
        }
        for (int s = 0; s < 3; ++s) p[s] = cru_host_mma_elem(p[s], a[s], b);
    }
    return __fadd_rn(0.0f, __fadd_rn(__fadd_rn(p[2], p[1]), p[0]));
}

// The block values of one output: row x [K] against column w [K], blocks c = 0 .. K/64 - 1.
static std::vector<float> mma_blocks(const float* x, const signed char* w, int K) {
    std::vector<float> b;
    for (int c = 0; c < K / 64; ++c) b.push_back(mma_block(x + 64 * c, w + 64 * c));
    return b;
}

// The codes as bf16, as DeviceWeight.wb holds them for the stack's MMA forms: an int8
// code's bf16 is exactly the top half of its f32.
static std::vector<unsigned short> codes_bf16(const std::vector<signed char>& w) {
    std::vector<unsigned short> b(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
        const float f = (float)w[i];
        unsigned u;
        std::memcpy(&u, &f, 4);
        b[i] = (unsigned short)(u >> 16);
    }
    return b;
}

// p_0 + p_1 + ... from the first (the combines' and finishers' order), or, for a
// negative control, from the last. Block values already carry their 0 +, so this is also
// the GEMMs' total = 0 + b_0 + b_1 + ... bit for bit. Empty: 0.
static float ordered_sum(std::vector<float> p, bool descending) {
    if (p.empty()) return 0.0f;
    if (descending) std::reverse(p.begin(), p.end());
    float t = p[0];
    for (size_t i = 1; i < p.size(); ++i) t = __fadd_rn(t, p[i]);
    return t;
}
