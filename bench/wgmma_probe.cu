// wgmma_probe.cu: does the warpgroup MMA (wgmma.mma_async, sm_90a) sum a 16-long bf16 dot
// product into an f32 accumulator with the same bits as mma.sync.m16n8k16, the instruction
// the tensor-core GEMM order is stated in (cuda/linear_mma.cu)? If it does, a GEMM built on
// wgmma can keep that order's bits while it issues one instruction a warpgroup where the
// mma.sync kernels issue eight a warp, and reads B from shared memory instead of registers.
//
// Layout: case c (blockIdx.x) owns A [64][16 * S] bf16 (row-major), B [S][8][16] bf16 (per
// step s, column n's 16 k contiguous: the mma's column-major B), C [64][8] f32. Outputs
// d_wg and d_mma [C][64][8] f32: D = A_s B_s + ... chained over the S steps from C, once
// with wgmma.m64n8k16 (A from registers, B from shared memory through a descriptor) and once
// with each warp's mma.sync.m16n8k16 over its 16 rows.
// Thread mapping: one warpgroup (128 threads) a CTA; warp w holds rows 16 w .. 16 w + 15;
// lane = 4 g + t holds A (row g, k 2t, 2t+1), (row g+8, ..), (row g, 2t+8, 2t+9), (row g+8,
// ..), and D (row g, cols 2t, 2t+1), (row g+8, the same): the fragment layouts of mma.sync's
// m16n8k16, which wgmma's m64nNk16 uses per warp for A in registers and for D.
// B in shared memory, no swizzle: step s's two core matrices (k 0-7 and 8-15, each 8
// columns x 16 bytes, a column's 8 k contiguous) at s * 256 and s * 256 + 128 bytes.
// `mode` picks which descriptor field carries the 128-byte distance between them (0: the
// leading-dimension offset, 1: the stride offset), since only one reading of the PTX
// manual's fields gives the right products; the host compares both against float64.
#include <cuda_bf16.h>
#include <stdint.h>

#define MAX_STEPS 8

__device__ __forceinline__ uint64_t desc_of(const void* smem, unsigned lbo, unsigned sbo) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    uint64_t d = 0;
    d |= (uint64_t)((a & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
    return d;  // base offset 0, swizzle 0 (none)
}

__device__ __forceinline__ void wg_step(float (&d)[4], const unsigned (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "%8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

__device__ __forceinline__ void mma_step(float (&d)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

extern "C" __global__ void __launch_bounds__(128)
probe(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B,
      const float* __restrict__ C, float* __restrict__ d_wg, float* __restrict__ d_mma,
      int steps, int mode) {
    __shared__ __align__(128) uint16_t bs[MAX_STEPS * 128];
    const int c = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, K = 16 * steps;
    const uint16_t* a_c = A + (size_t)c * 64 * K;
    const uint16_t* b_c = B + (size_t)c * steps * 128;
    // B into the core-matrix layout: element (s, n, k) at s * 128 + (k / 8) * 64 + n * 8 + k % 8.
    for (int i = threadIdx.x; i < steps * 128; i += 128) {
        const int s = i / 128, n = (i / 16) % 8, k = i % 16;
        bs[s * 128 + (k / 8) * 64 + n * 8 + k % 8] = b_c[i];
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic stores -> wgmma
    __syncthreads();
    const int r0 = 16 * w + g, r1 = r0 + 8;
    auto pair = [&](int row, int k) {  // two bf16 of A's row at k, k + 1 -> one register
        return (unsigned)a_c[(size_t)row * K + k] | ((unsigned)a_c[(size_t)row * K + k + 1] << 16);
    };
    const float* c_c = C + (size_t)c * 64 * 8;
    float dw[4] = {c_c[r0 * 8 + 2 * t], c_c[r0 * 8 + 2 * t + 1], c_c[r1 * 8 + 2 * t],
                   c_c[r1 * 8 + 2 * t + 1]};
    float dm[4] = {dw[0], dw[1], dw[2], dw[3]};
    const unsigned lbo = mode == 0 ? 128u : 256u, sbo = mode == 0 ? 256u : 128u;
    for (int s = 0; s < steps; ++s) {
        const int kb = 16 * s;
        const unsigned a[4] = {pair(r0, kb + 2 * t), pair(r1, kb + 2 * t),
                               pair(r0, kb + 2 * t + 8), pair(r1, kb + 2 * t + 8)};
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wg_step(dw, a, desc_of(bs + s * 128, lbo, sbo));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        // mma.sync's B: column g, k 2t, 2t+1 and 2t+8, 2t+9 of step s.
        const uint16_t* bcol = b_c + (size_t)s * 128 + g * 16;
        const unsigned b[2] = {(unsigned)bcol[2 * t] | ((unsigned)bcol[2 * t + 1] << 16),
                               (unsigned)bcol[2 * t + 8] | ((unsigned)bcol[2 * t + 9] << 16)};
        mma_step(dm, a, b);
    }
    float* ow = d_wg + (size_t)c * 64 * 8;
    float* om = d_mma + (size_t)c * 64 * 8;
    ow[r0 * 8 + 2 * t] = dw[0]; ow[r0 * 8 + 2 * t + 1] = dw[1];
    ow[r1 * 8 + 2 * t] = dw[2]; ow[r1 * 8 + 2 * t + 1] = dw[3];
    om[r0 * 8 + 2 * t] = dm[0]; om[r0 * 8 + 2 * t + 1] = dm[1];
    om[r1 * 8 + 2 * t] = dm[2]; om[r1 * 8 + 2 * t + 1] = dm[3];
}
