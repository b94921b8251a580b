// prelude.h: the subset of CUDA that the host-run kernels use (cuda/linear_chunks.cu,
// decode_stack.cu, the attention and MMA kernels, and the sampler, sampling.cu), on the
// host, so a test can run the kernels' own source on the CPU (tests/test_kernels_on_host.py,
// tests/test_sampler_on_host.py).
//
// Why: the GPU is not always at hand, and the kernel's index arithmetic (tiles, K tails,
// the scratch layout, the finisher's rows and columns, the last-ticket hand-off) is where a
// bug would hide. Mapping: one CTA at a time, its 256 threads as std::threads meeting at a
// std::barrier for __syncthreads; __shared__ becomes function-static (one CTA runs at a
// time, and the kernel never reads shared memory written by a previous CTA); CTAs run in a
// shuffled order, so any CTA of a tile may draw the last ticket. (A kernel built for clusters
// of two runs both CTAs of a cluster at once: cluster_host.h.) Rounding: std::fma and
// volatile single-precision operations (build with -ffp-contract=off), which round as the
// CUDA _rn intrinsics do. Not a model of the GPU memory system: fences are host fences.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim, blockDim;
inline thread_local std::barrier<>* cta_barrier = nullptr;  // this thread's CTA's
inline void __syncthreads() { cta_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct float2 {
    float x, y;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline float __uint_as_float(unsigned v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned v;
    std::memcpy(&v, &f, 4);
    return v;
}
// Byte i of the result = byte (selector nibble i & 7) of the 8-byte value {y:x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)x | ((uint64_t)y << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
inline unsigned atomicAdd(unsigned* p, unsigned v) {  // thread 0 of one CTA at a time
    const unsigned old = *p;
    *p = old + v;
    return old;
}
// Warp shuffles (rowops.cuh's RMSNorm tree, the softmax's butterflies, the sampler's
// scans): the warp's 32 threads meet at their warp's barrier (set by the driver, with
// t_flat) around an exchange slot per thread.
inline thread_local int t_flat = 0;  // flat thread index in the CTA
inline std::barrier<>** warp_barriers = nullptr;
// Shuffles and votes for any 4- or 8-byte type, f64 rounding intrinsics and real atomics
// (the sampler's 512 threads update shared counters together). Every lane of the warp calls
// each collective, as the kernels' code guarantees.
inline uint64_t warp_slots64[1024];
template <class T> inline T cru_host_exchange(T v, int from) {
    std::barrier<>* b = warp_barriers[t_flat >> 5];
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    warp_slots64[t_flat] = bits;
    b->arrive_and_wait();
    T r = v;
    if (from >= 0) std::memcpy(&r, &warp_slots64[(t_flat & ~31) + from], sizeof(T));
    b->arrive_and_wait();
    return r;
}
template <class T> inline T __shfl_down_sync(unsigned, T v, int off) {
    const int lane = t_flat & 31;
    return cru_host_exchange(v, lane + off < 32 ? lane + off : -1);
}
template <class T> inline T __shfl_up_sync(unsigned, T v, int off) {
    const int lane = t_flat & 31;
    return cru_host_exchange(v, lane >= off ? lane - off : -1);
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
    return cru_host_exchange(v, (t_flat & 31) ^ mask);
}
// One warp-wide vote over every lane's v: MATCH, the lanes holding this lane's v; SUM, the
// u32 sum of v over the lanes in this lane's mask; BALLOT, the lanes whose v is nonzero.
enum { CRU_MATCH, CRU_SUM, CRU_BALLOT };
inline unsigned cru_host_lanes(uint64_t v, uint32_t mask, int mode) {
    std::barrier<>* b = warp_barriers[t_flat >> 5];
    const int base = t_flat & ~31;
    warp_slots64[t_flat] = v;
    b->arrive_and_wait();
    unsigned r = 0;
    for (int l = 0; l < 32; ++l) {
        const uint64_t o = warp_slots64[base + l];
        if (mode == CRU_SUM) r += (mask >> l) & 1u ? (unsigned)o : 0u;
        else if (mode == CRU_MATCH) r |= o == v ? 1u << l : 0u;
        else r |= o != 0 ? 1u << l : 0u;
    }
    b->arrive_and_wait();
    return r;
}
inline unsigned __match_any_sync(unsigned, int v) {
    return cru_host_lanes((uint64_t)(uint32_t)v, 0, CRU_MATCH);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) { return cru_host_lanes(v, mask, CRU_SUM); }
inline unsigned __ballot_sync(unsigned, int pred) { return cru_host_lanes(pred != 0, 0, CRU_BALLOT); }
inline void __syncwarp(unsigned = 0xffffffffu) { warp_barriers[t_flat >> 5]->arrive_and_wait(); }
inline std::atomic<int> cru_host_or{0};
inline int __syncthreads_or(int pred) {
    if (pred) cru_host_or.store(1);
    __syncthreads();
    const int r = cru_host_or.load();
    __syncthreads();
    if (t_flat == 0) cru_host_or.store(0);
    __syncthreads();
    return r;
}
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
inline double __ddiv_rn(double a, double b) { volatile double r = a / b; return r; }
inline double __ull2double_rn(unsigned long long v) { return (double)v; }
inline long long __double_as_longlong(double d) {
    long long v;
    std::memcpy(&v, &d, 8);
    return v;
}
inline double __longlong_as_double(long long v) {
    double d;
    std::memcpy(&d, &v, 8);
    return d;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }

// common.cuh's exp and reciprocal: the GPU's __expf is an approximation of its own, so the
// host stands in with the library's; a driver's reference calls these same functions.
inline float __expf(float x) { return std::exp(x); }
inline unsigned __brev(unsigned x) {  // common.cuh's leaf order helper
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline float __frcp_rn(float x) { volatile float r = 1.0f / x; return r; }

// mma.m16n8k16 (bf16 in, f32 accumulate) for mma_common.cuh: the warp's lanes deposit their
// fragments, meet, and each forms its four outputs from the whole A (16 x 16) and B (16 x 8).
// Its sum is a stand-in, not the tensor core's: c + the 16 exact products in slot order, in
// double, rounded once (cru_host_mma_elem, which the drivers' references call too). So the
// host checks the kernels' plumbing (fragments, blocks, tiles, epilogues), not the hardware.
inline unsigned warp_frag[1024][6];
inline float cru_host_bf16(unsigned reg, int half) {
    return __uint_as_float(((reg >> (16 * half)) & 0xffffu) << 16);
}
inline float cru_host_mma_elem(float c, const float* a, const float* b) {
    double s = c;
    for (int kk = 0; kk < 16; ++kk) s += (double)a[kk] * (double)b[kk];
    return (float)s;
}
inline void cru_host_mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    const int lane = t_flat & 31, base = t_flat - lane, g = lane >> 2, t = lane & 3;
    std::barrier<>* bar = warp_barriers[t_flat >> 5];
    for (int i = 0; i < 4; ++i) warp_frag[t_flat][i] = a[i];
    warp_frag[t_flat][4] = b[0];
    warp_frag[t_flat][5] = b[1];
    bar->arrive_and_wait();
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float av[16], bv[16];
        for (int kk = 0; kk < 16; ++kk) {  // slot kk: lane group (kk % 8) / 2, half kk % 2
            const int tt = (kk % 8) / 2, half = kk % 2;
            av[kk] = cru_host_bf16(warp_frag[base + 4 * (row % 8) + tt][(row >= 8) + 2 * (kk >= 8)],
                                   half);
            bv[kk] = cru_host_bf16(warp_frag[base + 4 * col + tt][4 + (kk >= 8)], half);
        }
        c[e] = cru_host_mma_elem(c[e], av, bv);
    }
    bar->arrive_and_wait();  // every lane has read before the fragments are reused
}

// rows_chunk.cuh's host branches (plain copies for cp.async, no register pins) and dynamic
// shared memory: one buffer, since one CTA runs at a time (a cluster: one per CTA).
#define CRU_HOST_SHIM 1
inline unsigned char cru_host_dyn_smem[256 * 1024] __attribute__((aligned(16)));
inline thread_local unsigned char* cru_host_smem = cru_host_dyn_smem;
#define CRU_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(cru_host_smem)

using std::max;
using std::min;

// One CTA at a time, its threads as std::threads (threadIdx, t_flat, warp barriers).
template <typename F>
inline void run_grid(dim3 grid, dim3 block, F kernel) {
    const int n = block.x * block.y;
    std::barrier<> bar(n);
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::barrier<>*> ptrs;
    for (int w = 0; w < n / 32; ++w) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        ptrs.push_back(warps.back().get());
    }
    warp_barriers = ptrs.data();
    gridDim = grid;
    blockDim = block;
    std::vector<std::thread> threads;
    for (int t = 0; t < n; ++t)
        threads.emplace_back([&, t] {
            cta_barrier = &bar;
            threadIdx = {(unsigned)(t % block.x), (unsigned)(t / block.x), 0};
            t_flat = t;
            for (unsigned z = 0; z < std::max(grid.z, 1u); ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; ++x) {
                        blockIdx = {x, y, z};
                        kernel();
                        bar.arrive_and_wait();  // the next CTA starts once this one finished
                    }
        });
    for (auto& t : threads) t.join();
}

#include "cluster_host.h"  // clusters of two CTAs: cluster.cuh and run_grid_cluster2
