// softmax_group.cuh: the reference softmax (cru_ref_softmax, common.cuh) for G score
// vectors at once, for kernels whose CTA serves G query heads (attn_decode<G>).
//
// Why: running cru_ref_softmax G times puts G copies of its barriers, shuffle trees and
// single-thread combines one after another on the critical path. Here the G heads share
// every pass and every barrier; what each head computes is untouched.
//
// Layout: score vector g lives at scores[g * stride + j], j < len (stride >= len).
// Thread mapping (256 threads, 8 warps), per head g exactly as cru_ref_softmax:
//   - max: thread t folds fmaxf over t, t + 256, ... ascending, starting from -inf;
//     cru_warp_max; one thread combines the 8 warp maxima in ascending warp order,
//     fmaxf(red[0], red[1]) first;
//   - exp/sum: thread t writes cru_exp_shifted(s, max) over t, t + 256, ... in place and
//     adds them in that order from 0.0f; cru_warp_sum; one thread adds the 8 warp sums in
//     ascending order and takes cru_recip.
// Only who runs the combine changes: thread g combines head g (G threads of warp 0 in
// parallel instead of thread 0 G times), and max and sum get separate scratch, so the
// barrier cru_ref_softmax needs before reusing red[] is gone: 3 barriers for all G heads
// instead of 6 per head. No standard headers (NVRTC).
#pragma once

#include "common.cuh"

template <int G>
struct CruSoftmaxScratch {
    float red_max[G][8];  // warp maxima, head-major
    float red_sum[G][8];  // warp sums
    float max[G];         // the broadcast maximum per head
    float inv[G];         // 1 / sum per head: the result
};

// The whole softmax of G heads. On return the exp values are in place and visible to
// every thread; sh.inv[g] (1 / sum of head g) is written by thread g and visible after the
// caller's next __syncthreads() (attn_decode reaches one before its first read anyway, so a
// barrier here would only add a wait). sh is free again once inv has been read.
template <int G>
__device__ __forceinline__ void cru_ref_softmax_g(float* scores, int stride, int len,
                                                  CruSoftmaxScratch<G>& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float m[G];
#pragma unroll
    for (int g = 0; g < G; ++g) m[g] = CRU_NEG_INF;
    for (int j = tid; j < len; j += 256) {
#pragma unroll
        for (int g = 0; g < G; ++g) m[g] = fmaxf(m[g], scores[g * stride + j]);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) m[g] = cru_warp_max(m[g]);  // G independent trees interleave
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) sh.red_max[g][warp] = m[g];
    }
    __syncthreads();
    if (tid < G) {
        float t = sh.red_max[tid][0];
        for (int w = 1; w < 8; ++w) t = fmaxf(t, sh.red_max[tid][w]);
        sh.max[tid] = t;
    }
    __syncthreads();
    float sum[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = sh.max[g];
        sum[g] = 0.0f;
    }
    for (int j = tid; j < len; j += 256) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float e = cru_exp_shifted(scores[g * stride + j], m[g]);
            scores[g * stride + j] = e;
            sum[g] = cru_add(sum[g], e);
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) sum[g] = cru_warp_sum(sum[g]);
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) sh.red_sum[g][warp] = sum[g];
    }
    __syncthreads();  // also publishes the exp values written above
    if (tid < G) {
        float t = sh.red_sum[tid][0];
        for (int w = 1; w < 8; ++w) t = cru_add(t, sh.red_sum[tid][w]);
        sh.inv[tid] = cru_recip(t);
    }
}
