// sampling_select.cuh: ordering a row's keys for the device sampler (cuda/sampling.cu).
//
// descend/select_top: a radix select over u64 keys (8-bit digits from the top) that narrows
// to the K-th best key, then gathers the best K (<= CAP) into shared memory and bitonic-sorts
// them by (key desc, id asc). restrict_to_top: keeps only the best K of a row in scratch
// (K > CAP). full_sort: the fallback, a stable block LSD radix sort of all V (key, id) pairs
// in global scratch. One 512-thread block per row; counting atomics only (their order
// cannot change a count), and claimed slots are sorted before anyone reads them.
#pragma once
#include "sampling_block.cuh"

// ---- radix select and the sorted candidate prefix ------------------------------------------
struct ScratchKeys {
    const u64* k;
    __device__ u64 operator()(int i) const { return k[i]; }
};

struct RawKeys {  // okey of the f32 logit divided by t (t = 1: the logit itself)
    const float* raw;
    double t;
    __device__ u64 operator()(int i) const {
        return okey(t == 1.0 ? (double)raw[i] : __ddiv_rn((double)raw[i], t));
    }
};

struct RawValues {
    const float* raw;
    __device__ double operator()(int i) const { return (double)raw[i]; }
};

struct LogprobKeys {
    const float* raw;
    double m, lse;
    __device__ u64 operator()(int i) const { return okey(logprob_of(raw[i], m, lse)); }
};

struct Range {  // keys k with (k & mask) == prefix; G keys lie above it, B inside
    u64 prefix, mask;
    int above, inside;
};

// Narrow, 8 bits at a time from the top, to the key range holding the K-th best key, until
// at most `stop` keys lie at or above the range (or every bit is fixed: ties).
template <class KF>
__device__ Range descend(const KF& kf, int n, int K, int stop, Shared& sh) {
    Range r = {0ull, 0ull, 0, n};
    for (int shift = 56; shift >= 0 && r.above + r.inside > stop; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += THREADS) sh.hist[i] = 0;
        __syncthreads();
        // Most keys share their top digits, so a warp counts its lanes' digits once per
        // distinct digit (match_any) rather than 32 atomics on one counter.
        sweep(n, kf, [&](int, bool ok, u64 k) {
            const int d = ok && (k & r.mask) == r.prefix ? (int)((k >> shift) & 255) : 256;
            const u32 peers = __match_any_sync(FULL_MASK, d);
            if (d < 256 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sh.hist[d], __popc(peers));
        });
        __syncthreads();
        if (threadIdx.x < 32) {  // lane l holds buckets 255 - 8l ... 248 - 8l, best first
            const int lane = threadIdx.x;
            int c[8], tot = 0;
            for (int j = 0; j < 8; ++j) { c[j] = sh.hist[255 - 8 * lane - j]; tot += c[j]; }
            int incl = tot;
            for (int off = 1; off < 32; off <<= 1) {
                const int t = __shfl_up_sync(FULL_MASK, incl, off);
                if (lane >= off) incl += t;
            }
            const int need = K - r.above;
            int run = incl - tot;
            if (run < need && incl >= need) {
                for (int j = 0; j < 8; ++j) {
                    if (run + c[j] >= need) {
                        sh.sel_bucket = 255 - 8 * lane - j;
                        sh.sel_above = run;
                        sh.sel_count = c[j];
                        break;
                    }
                    run += c[j];
                }
            }
        }
        __syncthreads();
        r.prefix |= (u64)sh.sel_bucket << shift;
        r.mask |= 0xFFull << shift;
        r.above += sh.sel_above;
        r.inside = sh.sel_count;
        __syncthreads();
    }
    return r;
}

// Walk ids upward, taking keys equal to `target` until `need` are taken; they go to
// dkey/did[base + rank] when dkey is set. Returns the id of the last one taken.
template <class KF>
__device__ int take_tied(const KF& kf, int n, u64 target, int need, u64* dkey, u32* did,
                         int base, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int taken = 0;
    for (int start = 0; start < n && taken < need; start += THREADS) {
        const int i = start + threadIdx.x;
        const bool f = i < n && kf(i) == target;
        const u32 bal = __ballot_sync(FULL_MASK, f);
        if (lane == 0) sh.red_i[warp] = __popc(bal);
        __syncthreads();
        int before = 0, tot = 0;
        for (int w = 0; w < WARPS; ++w) {
            before += w < warp ? sh.red_i[w] : 0;
            tot += sh.red_i[w];
        }
        const int rank = taken + before + __popc(bal & ((1u << lane) - 1u));
        if (f && rank < need) {
            if (dkey != 0) { dkey[base + rank] = target; did[base + rank] = (u32)i; }
            if (rank == need - 1) sh.result = i;
        }
        taken += tot;
        __syncthreads();
    }
    const int last = sh.result;
    __syncthreads();
    return last;
}

__device__ __forceinline__ bool better(u64 ka, u32 ia, u64 kb, u32 ib) {
    return ka > kb || (ka == kb && ia < ib);
}

#define SORT_E (CAP / THREADS)  // elements a thread holds in the bitonic sort

// Sort f.key/f.id[0, m) best first, (key desc, id asc); m <= CAP. A bitonic network over
// p = max(32, pow2 >= m) slots: element i = e * THREADS + tid lives in thread tid's
// registers (slot e), so partners at distance j >= THREADS are in the same thread, j < 32 in
// the same warp (shuffles), and only 32 <= j < THREADS goes through shared memory.
__device__ void bitonic_sort(int m, Shared& sh) {
    u64* key = sh.big.f.key;
    u32* id = sh.big.f.id;
    int p = 32;  // whole warps: a warp's slots are all inside the network or all padding
    while (p < m) p <<= 1;
    const int ne = p > THREADS ? p / THREADS : 1;
    u64 k[SORT_E];
    u32 d[SORT_E];
#pragma unroll
    for (int e = 0; e < SORT_E; ++e) {
        const int i = e * THREADS + threadIdx.x;
        k[e] = i < m ? key[i] : 0ull;  // padding sorts last
        d[e] = i < m ? id[i] : 0xFFFFFFFFu;
    }
    __syncthreads();
    for (int kk = 2; kk <= p; kk <<= 1) {
        int j = kk >> 1;
        for (; j >= THREADS; j >>= 1) {  // partners in this thread
            // Both slot indices constant after unrolling, so k/d stay in registers.
#pragma unroll
            for (int e = 0; e < SORT_E; ++e) {
#pragma unroll
                for (int e2 = e + 1; e2 < SORT_E; ++e2) {
                    if ((e ^ e2) != j / THREADS || e2 >= ne) continue;
                    const bool first_best = ((e * THREADS + (int)threadIdx.x) & kk) == 0;
                    if (first_best ? better(k[e2], d[e2], k[e], d[e]) : better(k[e], d[e], k[e2], d[e2])) {
                        const u64 tk = k[e]; k[e] = k[e2]; k[e2] = tk;
                        const u32 td = d[e]; d[e] = d[e2]; d[e2] = td;
                    }
                }
            }
        }
        if (j >= 32) {  // partners in other warps: through shared memory
#pragma unroll
            for (int e = 0; e < SORT_E; ++e)
                if (e < ne) { key[e * THREADS + threadIdx.x] = k[e]; id[e * THREADS + threadIdx.x] = d[e]; }
            __syncthreads();
            for (; j >= 32; j >>= 1) {
                for (int i = threadIdx.x; i < p; i += THREADS) {
                    const int l = i ^ j;
                    if (l > i) {
                        const bool first_best = (i & kk) == 0;
                        if (first_best ? better(key[l], id[l], key[i], id[i])
                                       : better(key[i], id[i], key[l], id[l])) {
                            const u64 tk = key[i]; key[i] = key[l]; key[l] = tk;
                            const u32 ti = id[i]; id[i] = id[l]; id[l] = ti;
                        }
                    }
                }
                __syncthreads();
            }
#pragma unroll
            for (int e = 0; e < SORT_E; ++e)
                if (e < ne) { k[e] = key[e * THREADS + threadIdx.x]; d[e] = id[e * THREADS + threadIdx.x]; }
            __syncthreads();
        }
        for (; j > 0; j >>= 1) {  // partners in this warp: shuffles
#pragma unroll
            for (int e = 0; e < SORT_E; ++e) {
                if (e >= ne) break;  // block-uniform, so whole warps skip together
                const u64 ok = __shfl_xor_sync(FULL_MASK, k[e], j);
                const u32 od = __shfl_xor_sync(FULL_MASK, d[e], j);
                const int i = e * THREADS + threadIdx.x;
                const bool lower = (i & j) == 0, first_best = (i & kk) == 0;
                // The lower slot of a pair keeps the better one where the block runs best first.
                const bool take = lower == first_best ? better(ok, od, k[e], d[e]) : better(k[e], d[e], ok, od);
                if (take) { k[e] = ok; d[e] = od; }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < SORT_E; ++e)
        if (e < ne) { key[e * THREADS + threadIdx.x] = k[e]; id[e * THREADS + threadIdx.x] = d[e]; }
    __syncthreads();
}

// The best K (<= CAP) keys, sorted best first into f.key/f.id[0, K).
template <class KF>
__device__ void select_top(const KF& kf, int n, int K, Shared& sh) {
    const Range r = descend(kf, n, K, CAP, sh);
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    const bool tied = r.above + r.inside > CAP;  // every bit fixed: the range is one key
    sweep(n, kf, [&](int i, bool ok, u64 k) {
        if (ok && (tied ? k > r.prefix : (k & r.mask) >= r.prefix)) {
            const int slot = atomicAdd(&sh.count, 1);
            sh.big.f.key[slot] = k;
            sh.big.f.id[slot] = (u32)i;
        }
    });
    __syncthreads();
    if (tied) take_tied(kf, n, r.prefix, K - r.above, sh.big.f.key, sh.big.f.id, r.above, sh);
    bitonic_sort(tied ? K : r.above + r.inside, sh);
}

// Keep only the best K keys (CAP < K < V): every other key becomes 0, below any real key.
__device__ void restrict_to_top(u64* keys, int n, int K, Shared& sh) {
    const ScratchKeys kf = {keys};
    const Range r = descend(kf, n, K, K, sh);
    const bool tied = r.above + r.inside > K;
    const int cut = tied ? take_tied(kf, n, r.prefix, K - r.above, (u64*)0, (u32*)0, 0, sh) : BIG_INT;
    sweep(n, kf, [&](int i, bool ok, u64 k) {
        const u64 m = k & r.mask;
        if (ok && !(m > r.prefix || (m == r.prefix && i <= cut))) keys[i] = 0ull;
    });
    __syncthreads();
}

// ---- the full-row fallback: stable LSD radix sort, (key desc, id asc) ------------------------
// 8-bit digits, least significant first; digits every key shares are skipped. Each tile is
// SORT_ITEMS * THREADS consecutive elements: warp w loads its 32 * SORT_ITEMS at once, ranks
// them in SORT_ITEMS rounds of 32 (match_any), then per-digit offsets over the warps keep the
// order stable.
__device__ void full_sort(u64* keys, u64* keys2, u32* ids1, u32* ids2, int n, Shared& sh,
                          const u64*& out_key, const u32*& out_id) {
    SortArrays& s = sh.big.s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < 8 * 256; i += THREADS) (&s.hist[0][0])[i] = 0;
    for (int i = threadIdx.x; i < WARPS * 256; i += THREADS) (&s.wcount[0][0])[i] = 0;
    __syncthreads();
    const ScratchKeys kf = {keys};
    sweep(n, kf, [&](int i, bool ok, u64 k) {
        if (ok) ids1[i] = (u32)i;
        for (int p = 0; p < 8; ++p) {
            const int d = ok ? 255 - (int)((k >> (8 * p)) & 255) : 256;
            const u32 peers = __match_any_sync(FULL_MASK, d);
            if (d < 256 && lane == __ffs(peers) - 1) atomicAdd(&s.hist[p][d], __popc(peers));
        }
    });
    __syncthreads();
    u64 *sk = keys, *dk = keys2;
    u32 *si = ids1, *di = ids2;
    for (int p = 0; p < 8; ++p) {
        if (__syncthreads_or(threadIdx.x < 256 && s.hist[p][threadIdx.x] == n)) continue;
        if (threadIdx.x < 32) {  // exclusive scan of the 256 digit counts: bucket starts
            int c[8], tot = 0;
            for (int j = 0; j < 8; ++j) { c[j] = s.hist[p][8 * lane + j]; tot += c[j]; }
            int incl = tot;
            for (int off = 1; off < 32; off <<= 1) {
                const int t = __shfl_up_sync(FULL_MASK, incl, off);
                if (lane >= off) incl += t;
            }
            int run = incl - tot;
            for (int j = 0; j < 8; ++j) { s.hist[p][8 * lane + j] = run; run += c[j]; }
        }
        __syncthreads();
        for (int tile = 0; tile < n; tile += SORT_ITEMS * THREADS) {
            u64 kk[SORT_ITEMS];
            u32 ii[SORT_ITEMS];
            int rank[SORT_ITEMS], dig[SORT_ITEMS];
            const int first = tile + warp * 32 * SORT_ITEMS + lane;
#pragma unroll
            for (int q = 0; q < SORT_ITEMS; ++q) {
                const int i = first + q * 32;
                kk[q] = i < n ? sk[i] : 0ull;
                ii[q] = i < n ? si[i] : 0u;
            }
#pragma unroll
            for (int q = 0; q < SORT_ITEMS; ++q) {
                const bool valid = first + q * 32 < n;
                dig[q] = valid ? 255 - (int)((kk[q] >> (8 * p)) & 255) : 256;
                const u32 peers = __match_any_sync(FULL_MASK, dig[q]);
                const int before = valid ? s.wcount[warp][dig[q]] : 0;
                rank[q] = before + __popc(peers & ((1u << lane) - 1u));
                __syncwarp();
                if (valid && lane == __ffs(peers) - 1) s.wcount[warp][dig[q]] += __popc(peers);
                __syncwarp();
            }
            __syncthreads();
            if (threadIdx.x < 256) {  // warp w's first slot for digit d, then the next tile's base
                int run = s.hist[p][threadIdx.x];
                for (int w = 0; w < WARPS; ++w) {
                    const int t = s.wcount[w][threadIdx.x];
                    s.wcount[w][threadIdx.x] = run;
                    run += t;
                }
                s.hist[p][threadIdx.x] = run;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < SORT_ITEMS; ++q) {
                if (dig[q] < 256) {
                    const int pos = s.wcount[warp][dig[q]] + rank[q];
                    dk[pos] = kk[q];
                    di[pos] = ii[q];
                }
            }
            __syncthreads();
            for (int i = threadIdx.x; i < WARPS * 256; i += THREADS) (&s.wcount[0][0])[i] = 0;
            __syncthreads();
        }
        u64* tk = sk; sk = dk; dk = tk;
        u32* ti = si; si = di; di = ti;
    }
    out_key = sk;
    out_id = si;
}
