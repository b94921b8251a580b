// wgmma_ops.cuh: the warpgroup-MMA operations of the wgmma GEMMs (cuda/linear_wgmma.cu,
// bench/wgmma_gemm.cu): fence, commit, wait, the generic-to-async proxy fence, a no-swizzle
// shared-memory descriptor, and m64nNk16 bf16 -> f32 with A in registers (mma.sync's
// m16n8k16 A layout per warp: warp w of the warpgroup holds rows 16 w ..) and B through the
// descriptor; D per 8-column group i as (row g, cols 8 i + 2 t, + 1), (row g + 8, the same),
// lane = 4 g + t.
// wgmma exists only in the arch-specific target (sm_90a; kernels/source.py builds these
// files for it). Built for anything else, the operations trap, so a kernel cannot run
// silently wrong (tests/test_attention_nvcc.py still compiles every file for sm_90).
// tests/cuda_host/wgmma_host.h supplies host stand-ins for all of them (CRU_HOST_SHIM).
// No standard headers (NVRTC).
#pragma once

#ifndef CRU_HOST_SHIM
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CRU_WG_ASM(...) asm volatile(__VA_ARGS__)
#else
#define CRU_WG_ASM(...) __trap()
#endif
__device__ __forceinline__ void wg_fence() { CRU_WG_ASM("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    CRU_WG_ASM("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    CRU_WG_ASM("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Generic-proxy stores to shared memory before the async proxy (wgmma) reads them.
__device__ __forceinline__ void wg_proxy_fence() {
    CRU_WG_ASM("fence.proxy.async.shared::cta;" ::: "memory");
}

// Start address, leading and stride byte offsets (each >> 4 in 14 bits), base offset 0,
// no swizzle.
__device__ __forceinline__ unsigned long long wg_desc(const void* smem, unsigned lbo,
                                                      unsigned sbo) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    return (unsigned long long)((a & 0x3FFFF) >> 4) |
           ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}

// d = A B (+ d when acc) for one m64nBNk16 step (A: this thread's four registers; B: the
// descriptor). acc = false (scale-d 0) starts a part's chain without zeroing d first: moves
// into d between wgmmas would make ptxas serialise them (C7519). It differs from adding to
// +0 at most in the sign of an exactly-zero part, which the block sums then remove: a
// total starts as 0.0f and x + (-0) == x, +0 + -0 == +0 (round to nearest).
__device__ __forceinline__ void wg_mma(float (&d)[8], const unsigned (&a)[4], unsigned long long b,
                                       bool acc) {
    CRU_WG_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((int)acc));
}

__device__ __forceinline__ void wg_mma(float (&d)[16], const unsigned (&a)[4], unsigned long long b,
                                       bool acc) {
    CRU_WG_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, "
        "p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((int)acc));
}

__device__ __forceinline__ void wg_mma(float (&d)[32], const unsigned (&a)[4], unsigned long long b,
                                       bool acc) {
    CRU_WG_ASM(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,"
        "%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((int)acc));
}
#endif  // CRU_HOST_SHIM

// Columns col, col + 1 of rows r0 and r1 = r0 + 8 from a thread's totals of a 64 x BN tile
// (D's layout), through linear_mma's store (scale, then the residual last).
template <int BN>
__device__ __forceinline__ void wg_store_tile(const float (&total)[BN / 2], float* y,
                                              const float* residual, const float* scale,
                                              int r0, int n0, int t, int M, int N) {
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
        const int col = n0 + 8 * i + 2 * t;
        if (r0 < M) cru_mma_store(y, residual, scale, r0, col, N, total[4 * i], total[4 * i + 1]);
        if (r0 + 8 < M)
            cru_mma_store(y, residual, scale, r0 + 8, col, N, total[4 * i + 2], total[4 * i + 3]);
    }
}
