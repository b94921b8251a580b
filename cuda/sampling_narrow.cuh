// sampling_narrow.cuh: the inverse-CDF draw past the sorted prefix, without sorting the row.
// (Included by cuda/sampling.cu after cross(); uses its Shared, sweep and bitonic_sort.)
//
// Layout: keys u64 [V] in the row's scratch slice (okey of y = x / T; 0 marks a key that
// top_k removed); shared memory: NarrowArrays (256 digit bins) while narrowing, then the
// FastArrays window (<= CAP keys, ids, weights). Thread mapping: the row's 512-thread block,
// as everywhere in the sampler; one warp decides each pass.
//
// What it answers: the first rank j, in (key desc, id asc) order over all candidates, whose
// sequential cumulative weight exceeds theta (the draw of a row with nothing truncated past
// the prefix: theta = u * total). The full-row sort answered it in ~0.8 ms; rows of flat
// distributions at T ~ 1 need it often (12% of the rows of the random 1,000-request workload
// on the H200). Instead, 8-bit digits of the keys from the top narrow the key range holding
// the crossing, as the radix select narrows to the K-th key, but by weight:
//   * a pass bins every in-range key by its next digit: a count and the weights' sum in
//     fixed point (w in (0, 1] times 2^39, truncated; lanes of one digit add theirs with two
//     warp reductions, of the 20-bit low and 19-bit high halves, so 32 lanes fit a u32, then
//     one integer atomic; V <= 2^24 keeps a bin within 2^63). Integer sums, so the bins do
//     not depend on the order of the atomics. A bin's true sum W lies in
//     [FX, FX + count) / 2^39;
//   * the bucket is taken only when that bound, widened by 1e-10 relative for the host's
//     own rounding and exp, and theta's band say for certain that the cumulative weight is
//     at most theta before the bucket and above it at its end; otherwise NEED_SORT (the
//     caller's full sort), which happens only for theta within V * 2^-39 (9e-8 at 49,152)
//     of a bucket's edge. (At 2^26, with one reduction, 1.3% of a flat T = 1 workload's
//     rows fell back: a long tail's buckets weigh little, and 7e-4 is not little.);
//   * once the range holds <= CAP keys, they are gathered and bitonic-sorted in shared
//     memory, the weight above the range is summed in f64 by the block's fixed tree, and
//     cross() decides within the window with that offset and the window's ranks, under the
//     same bands as every other decision. A range of > CAP equal keys (every bit fixed) or
//     an ambiguous decision falls back to the full sort.
// So the token is the one the full sort would give, decided from the same bounds; only the
// route differs (PATH_NARROW).
#pragma once

#define FX_ONE 549755813888.0  // 2^39: a weight's fixed point, at most 2^39
#define FX_LOW 20                // the low half's bits: 32 lanes' halves each fit a u32

// 1 + 1e-10 / 1 - 1e-10: the host's sequential rounding (<= V * 2^-53 relative) and the
// host's exp against CUDA's, with room to spare, on a bin's exact bounds, for vocabularies
// up to ~450,000 (V * 2^-52 <= 1e-10). Past that (the sampler accepts up to 2^24) the
// margin should grow with V: a known limit, for the next change to this kernel.
#define FX_UP 1.0000000001
#define FX_DOWN 0.9999999999

__device__ int draw_narrowed(const u64* keys, int V, double y0, double theta, double tband,
                             int slack, Shared& sh) {
    NarrowArrays& na = sh.big.n;
    const ScratchKeys kf = {keys};
    const int lane = threadIdx.x & 31;
    u64 prefix = 0ull, mask = 0ull, above_fx = 0ull;
    int above_n = 0, inside = BIG_INT;
    for (int shift = 56; shift >= 0 && inside > CAP; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += THREADS) { na.fx[i] = 0ull; na.n[i] = 0; }
        if (threadIdx.x == 0) na.bucket = -1;
        __syncthreads();
        sweep(V, kf, [&](int, bool ok, u64 k) {
            const bool in = ok && k != 0ull && (k & mask) == prefix;
            const int d = in ? (int)((k >> shift) & 255) : 256;
            const u64 fx = in ? (u64)(weight_of(k, y0) * FX_ONE) : 0ull;
            const u32 peers = __match_any_sync(FULL_MASK, d);
            const u32 hi = __reduce_add_sync(peers, (u32)(fx >> FX_LOW));
            const u32 lo = __reduce_add_sync(peers, (u32)(fx & ((1ull << FX_LOW) - 1ull)));
            if (d < 256 && lane == __ffs(peers) - 1) {
                atomicAdd(&na.fx[d], ((u64)hi << FX_LOW) + (u64)lo);
                atomicAdd(&na.n[d], __popc(peers));
            }
        });
        __syncthreads();
        if (threadIdx.x < 32) {  // lane l: digits 255 - 8l ... 248 - 8l, best first
            u64 c[8], tot = 0ull;
            int cn[8], totn = 0;
            for (int j = 0; j < 8; ++j) {
                c[j] = na.fx[255 - 8 * lane - j];
                cn[j] = na.n[255 - 8 * lane - j];
                tot += c[j];
                totn += cn[j];
            }
            u64 incl = tot;
            int incn = totn;
            for (int off = 1; off < 32; off <<= 1) {
                const u64 t = __shfl_up_sync(FULL_MASK, incl, off);
                const int tn = __shfl_up_sync(FULL_MASK, incn, off);
                if (lane >= off) { incl += t; incn += tn; }
            }
            u64 run = above_fx + incl - tot;
            int runn = above_n + incn - totn;
            for (int j = 0; j < 8; ++j) {
                // Before the bucket: at most (run + runn) / 2^39; through it: at least
                // (run + c) / 2^39 (truncation only lowers a weight).
                const double hi_before = (double)(run + (u64)runn) / FX_ONE * FX_UP;
                const double lo_through = (double)(run + c[j]) / FX_ONE * FX_DOWN;
                if (cn[j] > 0 && (runn == 0 || hi_before < theta - tband) &&
                    lo_through > theta + tband) {
                    na.bucket = 255 - 8 * lane - j;
                    na.above_fx = run;
                    na.above_n = runn;
                    na.inside = cn[j];
                }
                run += c[j];
                runn += cn[j];
            }
        }
        __syncthreads();
        const int bucket = na.bucket;
        if (bucket < 0) return NEED_SORT;  // within rounding of a bucket's edge
        prefix |= (u64)bucket << shift;
        mask |= 0xFFull << shift;
        above_fx = na.above_fx;
        above_n = na.above_n;
        inside = na.inside;
        __syncthreads();
    }
    if (inside > CAP) return NEED_SORT;  // more than CAP equal keys
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    sweep(V, kf, [&](int i, bool ok, u64 k) {
        if (ok && k != 0ull && (k & mask) == prefix) {
            const int slot = atomicAdd(&sh.count, 1);
            sh.big.f.key[slot] = k;
            sh.big.f.id[slot] = (u32)i;
        }
    });
    __syncthreads();
    bitonic_sort(inside, sh);
    for (int j = threadIdx.x; j < inside; j += THREADS) sh.big.f.w[j] = weight_of(sh.big.f.key[j], y0);
    double s = 0.0;  // the weight above the window, in the block's fixed tree
    sweep(V, kf, [&](int, bool ok, u64 k) {
        if (ok && k != 0ull && (k & mask) > prefix) s = __dadd_rn(s, weight_of(k, y0));
    });
    const double above = block_sum_d(s, sh);
    const SmemView win = {sh.big.f.key, sh.big.f.id, sh.big.f.w};
    const Weights<SmemView> w = {win};
    const int r = cross(w, inside, theta, tband, false, -1.0, slack, sh, above, above_n);
    if (r == AMBIGUOUS || r >= inside) return NEED_SORT;
    return win.token(r);
}
