// wgmma_host.h: host stand-ins for the warpgroup MMA that cuda/wgmma_ops.cuh declares for
// cuda/linear_wgmma.cu and bench/wgmma_gemm.cu
// (wgmma.mma_async m64nNk16, bf16 in, f32 accumulate; A in registers, B in shared memory
// through a no-swizzle descriptor), for prelude.h's one-CTA-at-a-time threads.
//
// What is modelled: the fragment layouts (A per warp as mma.sync's m16n8k16, warp w rows
// 16 w ..; D per 8-column group i: row g cols 8 i + 2 t, + 1, then row g + 8) and the
// descriptor's reading of B: core matrix (kc, nc) (slots 8 kc .., columns 8 nc ..) at
// start + kc * LBO + nc * SBO, a column's 8 slots a 16-byte row. That reading is the
// kernel's mode 0; which field carries which distance on the GPU is bench/wgmma_probe.py's
// question, not this file's. Each output's step is prelude.h's cru_host_mma_elem (the
// stand-in sum the mma.sync kernels' host runs and mma_ref.h use), so a mismatch against
// mma_ref.h is an index, never a rounding. Completion is immediate: fence, commit and wait
// are no-ops.
#pragma once
#include <cstdint>

struct CruWgDesc {
    const unsigned char* start;
    unsigned lbo, sbo;
};
// A descriptor is a 64-bit value on the GPU; here it names an entry of the thread's ring.
inline thread_local CruWgDesc cru_wg_descs[64];
inline thread_local unsigned cru_wg_next = 0;
inline uint64_t wg_desc(const void* smem, unsigned lbo, unsigned sbo) {
    const unsigned i = cru_wg_next++ & 63;
    cru_wg_descs[i] = {static_cast<const unsigned char*>(smem), lbo, sbo};
    return i;
}
inline void wg_fence() {}
inline void wg_commit() {}
inline void wg_wait0() {}
inline void wg_proxy_fence() {}

// A CTA may hold several warpgroups (linear_wgmma_rows.cu), each calling these on its own
// schedule: a warpgroup meets at its own barrier (as bar.sync 1 + w does on the GPU), and
// its fragments sit at its own 128 entries.
inline std::barrier<>& cru_wg_barrier(int w) {
    static std::barrier<> bars[8] = {std::barrier<>(128), std::barrier<>(128),
                                     std::barrier<>(128), std::barrier<>(128),
                                     std::barrier<>(128), std::barrier<>(128),
                                     std::barrier<>(128), std::barrier<>(128)};
    return bars[w];
}
inline void wg_bar(int w) { cru_wg_barrier(w).arrive_and_wait(); }

inline unsigned cru_wg_frag[1024][4];
template <int N>
inline void wg_mma(float (&d)[N], const unsigned (&a)[4], uint64_t desc, bool acc) {
    const CruWgDesc b = cru_wg_descs[desc & 63];
    const int wg = t_flat >> 7, lane = t_flat & 31, w = (t_flat & 127) >> 5;
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) cru_wg_frag[t_flat][i] = a[i];
    wg_bar(wg);
    for (int e = 0; e < N; ++e) {
        const int row = 16 * w + g + 8 * ((e % 4) >> 1), col = 8 * (e / 4) + 2 * t + (e & 1);
        const int base = 128 * wg + 32 * (row / 16), r = row % 16;
        float av[16], bv[16];
        for (int kk = 0; kk < 16; ++kk) {  // slot kk: lane group (kk % 8) / 2, half kk % 2
            const int tt = (kk % 8) / 2, half = kk % 2, kc = kk / 8;
            av[kk] = cru_host_bf16(cru_wg_frag[base + 4 * (r % 8) + tt][(r >= 8) + 2 * kc], half);
            uint16_t bits;
            std::memcpy(&bits, b.start + kc * b.lbo + (col / 8) * b.sbo + (col % 8) * 16 +
                                   (kk % 8) * 2, 2);
            bv[kk] = cru_host_bf16(bits, 0);
        }
        d[e] = cru_host_mma_elem(acc ? d[e] : 0.0f, av, bv);
    }
    wg_bar(wg);  // every thread has read the fragments before they are replaced
}

// cuda/linear_wgmma.cu's cp.async: the copy (or the zero fill) happens at once.
inline void wp_cp16(void* dst, const void* src, int bytes) {
    if (bytes) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
}
inline void wp_commit() {}
template <int N> inline void wp_wait() {}
