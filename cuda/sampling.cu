// sampling.cu: the device sampler, crucible/engine/sampling.py's pipeline in f64 on the GPU.
//
// Layout: logits f32 [rows, V] row-major (the backend's final rows); meta: one int64 buffer,
// 16 words per sampled row then the penalty/mask entries as int32 quadruples (the layout is
// documented in crucible/backend/sampling_meta.py); scratch: four arrays [gridDim.x, V]
// (keys u64, keys2 u64, ids1 u32, ids2 u32), one slice per block; out: tokens int32 [R] and
// lp int64 [R, 43] = (count, 21 token ids, 21 f64 logprob bit patterns); paths int32 [R]
// (which routes a row took: diagnostics for the check command).
//
// Thread mapping: one 512-thread block samples one row at a time (block b takes rows b,
// b + gridDim.x, ...), so a row's result is a function of that row's logits and metadata
// only: every reduction is a fixed tree (per-thread strided or chunked sequential sums,
// warp shuffle trees, warp partials combined in ascending order by one thread), and the only
// atomics are integer counts and slot claims whose order cannot change a result (claimed
// slots are sorted by (key, id) before anyone reads them).
//
// A row, as the host sampler does it:
//   keys[i] = okey(x_i / T) (x_i: f64 logit after penalties and min_tokens masking); okey
//     maps an f64 to a u64 whose unsigned order is the numeric order (-0.0 taken as +0.0,
//     so ties stay ties); candidates are ordered by (key desc, id asc).
//   greedy (T = 0): a block argmax of keys (x itself) with the lowest id winning ties; with
//     no penalty entries it runs straight on the f32 logits (one read, no scratch).
//   top_k K (off: K = V): if CAP < K < V, a radix select (8-bit digits from the top)
//     finds the K-th key and demotes every non-candidate's key to 0 (ties at the K-th key
//     taken by id). Then a radix select of the best K candidates (K <= CAP) or of the best
//     FIRST_TIER (then CAP) of them, a gather into shared memory and a bitonic sort by
//     (key desc, id asc): the sorted prefix.
//   w_j = exp(y_j - y_0); total = sum of the K candidates' weights (a fixed tree).
//   top_p, min_p, the inverse-CDF draw: each asks "the first j whose sequential cumulative
//     sum reaches a threshold". A block scan (chunked, fixed tree) gives each prefix sum with
//     an error bound that also covers the host's sequential rounding; when the bound decides
//     the answer it is the host's answer, otherwise one thread redoes the sums sequentially
//     in the host's order. Either way the result equals the host pipeline run on these
//     weights. If the answer lies beyond the sorted prefix, the row falls back to a stable
//     block LSD radix sort of all V (key, id) pairs in scratch and repeats the same steps.
//   u = uniform(seed, n) is computed here with SplitMix64 (crucible/engine/rng.py).
//   logprobs: log-softmax of the raw logits ((x - max) - log(sum exp(x - max))), top-N by
//     (logprob desc, id asc) via the same radix select, plus the sampled token.
// Explicit-rounding intrinsics spell out every f64 step whose rounding a result depends on.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

#define THREADS 512
#define UNROLL 8           // loads a thread issues before using any: memory-level parallelism
#define SORT_ITEMS 8       // elements per thread in one tile of the full-row sort
#define WARPS (THREADS / 32)
#define CAP 2048
#define ROW_WORDS 16
#define LP_WORDS 43
#define LP_MAX 21
#define E_REP 1
#define E_PEN 2
#define E_MASK 4
#define FULL_MASK 0xffffffffu
#define BIG_INT 0x7fffffff
#define AMBIGUOUS (-2)
#define NEED_SORT (-1)
#define PATH_SORT 1        // the answer needed the full-row sort
#define PATH_SEQUENTIAL 2  // a rounding band sent a decision to the sequential host order
#define PATH_TOP_K 4       // top_k beyond the shared-memory prefix (restrict_to_top)
#define PATH_GREEDY 8      // greedy straight on the f32 logits
#define PATH_WIDE 16       // past top_k 2048 / no top_k, the first 256 did not decide it
#define FIRST_TIER 256     // sorted first when K > CAP: most rows of a chat model stop here

struct Row {
    double temp, top_p, min_p, rep, pres, freq;
    u64 seed, counter;
    int top_k, num_lp, first, count, logits_row;
};

struct FastArrays {  // the sorted candidate prefix
    u64 key[CAP];
    double w[CAP];
    u32 id[CAP];
};

struct SortArrays {  // the full-row radix sort's counters
    int wcount[WARPS][256];
    int hist[8][256];
};

struct Shared {
    union {
        FastArrays f;
        SortArrays s;
    } big;
    int hist[256];
    double red_d[WARPS];
    double scan_off[WARPS];
    u64 red_k[WARPS];
    int red_i[WARPS];
    double bc_d;
    u64 bc_k;
    int bc_i, sel_bucket, sel_above, sel_count, count, state, result;
    int path;  // which routes this row took (PATH_*), written by thread 0 only
};

// ---- scalars -----------------------------------------------------------------------------
__device__ __forceinline__ double neg_inf() { return __longlong_as_double(0xFFF0000000000000LL); }

__device__ __forceinline__ u64 okey(double v) {
    const u64 b = (u64)__double_as_longlong(__dadd_rn(v, 0.0));  // -0.0 + 0.0 = +0.0
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}

__device__ __forceinline__ double okey_value(u64 k) {
    const u64 b = (k >> 63) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
    return __longlong_as_double((i64)b);
}

__device__ __forceinline__ double weight_of(u64 key, double y0) {
    return exp(__dsub_rn(okey_value(key), y0));
}

__device__ __forceinline__ double logprob_of(float x, double m, double lse) {
    return __dsub_rn(__dsub_rn((double)x, m), lse);
}

// Rounding slack of a prefix sum: the host's sequential sum of j + 1 terms is within
// j * 2^-53 * P of the exact value, ours within (chunk + tree depth) * 2^-53 * P; this
// bound is twice their sum, so "certain" never misjudges.
__device__ __forceinline__ double band(int j, double p, int slack) {
    return (double)(j + slack) * 4.440892098500626e-16 * p;
}

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 random_bits(u64 seed, u64 n) {
    return mix64(seed + (n + 1ull) * 0x9E3779B97F4A7C15ull);
}

__device__ __forceinline__ double uniform01(u64 seed, u64 n) {
    // 53 random bits times 2^-53: both steps are exact.
    return __dmul_rn(__ull2double_rn(random_bits(seed, n) >> 11), 1.1102230246251565e-16);
}

__device__ Row load_row(const i64* meta, int r) {
    const i64* w = meta + (i64)r * ROW_WORDS;
    Row p;
    p.temp = __longlong_as_double(w[0]);
    p.top_p = __longlong_as_double(w[1]);
    p.min_p = __longlong_as_double(w[2]);
    p.rep = __longlong_as_double(w[3]);
    p.pres = __longlong_as_double(w[4]);
    p.freq = __longlong_as_double(w[5]);
    p.seed = (u64)w[6];
    p.counter = (u64)w[7];
    p.top_k = (int)w[8];
    p.num_lp = (int)w[9];
    p.first = (int)w[10];
    p.count = (int)w[11];
    p.logits_row = (int)w[12];
    return p;
}

// One pass over [0, n): each thread loads UNROLL elements (i = tid, tid + THREADS, ...) before
// handing them to f(i, valid, value) in ascending i. A row pass is latency-bound with one load
// in flight per thread; eight keep the SM's memory pipe busy. Every lane calls f, valid or
// not, so f may use warp collectives.
template <class LD, class F>
__device__ __forceinline__ void sweep(int n, const LD& load, F&& f) {
    typedef decltype(load(0)) T;
    for (int base = 0; base < n; base += THREADS * UNROLL) {
        T v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * THREADS + (int)threadIdx.x;
            v[u] = i < n ? load(i) : T();
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * THREADS + (int)threadIdx.x;
            f(i, i < n, v[u]);
        }
    }
}

// ---- block reductions (fixed trees) ---------------------------------------------------------
__device__ double block_sum_d(double v, Shared& sh) {
    for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_down_sync(FULL_MASK, v, off));
    if ((threadIdx.x & 31) == 0) sh.red_d[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = sh.red_d[0];
        for (int w = 1; w < WARPS; ++w) t = __dadd_rn(t, sh.red_d[w]);
        sh.bc_d = t;
    }
    __syncthreads();
    return sh.bc_d;
}

__device__ double block_max_d(double v, Shared& sh) {
    for (int off = 16; off > 0; off >>= 1) v = fmax(v, __shfl_down_sync(FULL_MASK, v, off));
    if ((threadIdx.x & 31) == 0) sh.red_d[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = sh.red_d[0];
        for (int w = 1; w < WARPS; ++w) t = fmax(t, sh.red_d[w]);
        sh.bc_d = t;
    }
    __syncthreads();
    return sh.bc_d;
}

__device__ int block_sum_i(int v, Shared& sh) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(FULL_MASK, v, off);
    if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < WARPS; ++w) t += sh.red_i[w];
        sh.bc_i = t;
    }
    __syncthreads();
    return sh.bc_i;
}

__device__ int block_min_i(int v, Shared& sh) {
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_down_sync(FULL_MASK, v, off));
    if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = sh.red_i[0];
        for (int w = 1; w < WARPS; ++w) t = min(t, sh.red_i[w]);
        sh.bc_i = t;
    }
    __syncthreads();
    return sh.bc_i;
}

// The best (key desc, id asc) pair of the block; returns the id.
__device__ int block_best(u64 key, int id, Shared& sh) {
    for (int off = 16; off > 0; off >>= 1) {
        const u64 k = __shfl_down_sync(FULL_MASK, key, off);
        const int i = __shfl_down_sync(FULL_MASK, id, off);
        if (k > key || (k == key && i < id)) { key = k; id = i; }
    }
    if ((threadIdx.x & 31) == 0) { sh.red_k[threadIdx.x >> 5] = key; sh.red_i[threadIdx.x >> 5] = id; }
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 bk = sh.red_k[0];
        int bi = sh.red_i[0];
        for (int w = 1; w < WARPS; ++w)
            if (sh.red_k[w] > bk || (sh.red_k[w] == bk && sh.red_i[w] < bi)) { bk = sh.red_k[w]; bi = sh.red_i[w]; }
        sh.bc_i = bi;
    }
    __syncthreads();
    return sh.bc_i;
}

// Exclusive prefix of one value per thread in thread order (Hillis-Steele within warps, then
// over the warp totals); `total` gets the sum of all.
__device__ double block_excl_scan(double v, Shared& sh, double& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double incl = v;
    for (int off = 1; off < 32; off <<= 1) {
        const double t = __shfl_up_sync(FULL_MASK, incl, off);
        if (lane >= off) incl = __dadd_rn(t, incl);
    }
    double excl = __shfl_up_sync(FULL_MASK, incl, 1);
    if (lane == 0) excl = 0.0;
    if (lane == 31) sh.red_d[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        double winc = lane < WARPS ? sh.red_d[lane] : 0.0;
        for (int off = 1; off < WARPS; off <<= 1) {
            const double t = __shfl_up_sync(FULL_MASK, winc, off);
            if (lane >= off) winc = __dadd_rn(t, winc);
        }
        double wex = __shfl_up_sync(FULL_MASK, winc, 1);
        if (lane == 0) wex = 0.0;
        if (lane < WARPS) sh.scan_off[lane] = wex;
        if (lane == WARPS - 1) sh.bc_d = winc;
    }
    __syncthreads();
    total = sh.bc_d;
    return __dadd_rn(sh.scan_off[warp], excl);
}

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

// Sort f.key/f.id[0, m) best first, (key desc, id asc); m <= CAP.
__device__ void bitonic_sort(int m, Shared& sh) {
    u64* key = sh.big.f.key;
    u32* id = sh.big.f.id;
    int p = 1;
    while (p < m) p <<= 1;
    for (int i = m + threadIdx.x; i < p; i += THREADS) { key[i] = 0ull; id[i] = 0xFFFFFFFFu; }
    __syncthreads();
    for (int k = 2; k <= p; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += THREADS) {
                const int l = i ^ j;
                if (l > i) {
                    const bool first_best = (i & k) == 0;
                    const bool swap = first_best ? better(key[l], id[l], key[i], id[i])
                                                 : better(key[i], id[i], key[l], id[l]);
                    if (swap) {
                        const u64 tk = key[i]; key[i] = key[l]; key[l] = tk;
                        const u32 ti = id[i]; id[i] = id[l]; id[l] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
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

// ---- top_p, min_p and the draw over a sorted candidate list --------------------------------
struct SmemView {
    const u64* key;
    const u32* id;
    const double* w;
    __device__ double weight(int j) const { return w[j]; }
    __device__ int token(int j) const { return (int)id[j]; }
};

struct GlobalView {
    const u64* key;
    const u32* id;
    double y0;
    __device__ double weight(int j) const { return weight_of(key[j], y0); }
    __device__ int token(int j) const { return (int)id[j]; }
};

template <class View> struct Weights {
    View v;
    __device__ double operator()(int j) const { return v.weight(j); }
};

template <class View> struct Shares {  // the host's w / w.sum()
    View v;
    double total;
    __device__ double operator()(int j) const { return __ddiv_rn(v.weight(j), total); }
};

// First j < n whose sequential prefix sum of a(0..j) is >= theta (ge) or > theta, n if none,
// AMBIGUOUS if rounding could decide it. With u_total >= 0, theta = u_total * (the sum of all
// n terms). theta is known within +-tband.
template <class A>
__device__ int cross(const A& a, int n, double theta, double tband, bool ge, double u_total,
                     int slack, Shared& sh) {
    const int per = (n + THREADS - 1) / THREADS;
    const int lo = min(n, (int)threadIdx.x * per), hi = min(n, lo + per);
    double local = 0.0;
    for (int j = lo; j < hi; ++j) local = __dadd_rn(local, a(j));
    double total;
    const double off = block_excl_scan(local, sh, total);
    if (u_total >= 0.0) {
        theta = __dmul_rn(u_total, total);
        tband = u_total * band(n, total, slack) + theta * 4.440892098500626e-16;
    }
    const double tlo = theta - tband, thi = theta + tband;
    int first = n, state = 0;
    double part = 0.0;
    for (int j = lo; j < hi; ++j) {
        part = __dadd_rn(part, a(j));
        const double p = __dadd_rn(off, part), b = band(j, p, slack);
        const bool below = ge ? (p + b < tlo) : (p + b <= tlo);
        if (!below) {
            first = j;
            state = (ge ? (p - b >= thi) : (p - b > thi)) ? 1 : 2;
            break;
        }
    }
    const int f = block_min_i(first, sh);
    if (f < n && first == f) sh.state = state;
    __syncthreads();
    if (f >= n) return n;
    return sh.state == 1 ? f : AMBIGUOUS;
}

// The same question answered by one thread in the host's order (numpy's cumsum + searchsorted).
template <class A>
__device__ int cross_sequential(const A& a, int n, double theta, bool ge, double u_total,
                                Shared& sh) {
    if (threadIdx.x == 0) {
        if (u_total >= 0.0) {
            double c = 0.0;
            for (int j = 0; j < n; ++j) c = __dadd_rn(c, a(j));
            theta = __dmul_rn(u_total, c);
        }
        int r = n;
        double c = 0.0;
        for (int j = 0; j < n; ++j) {
            c = __dadd_rn(c, a(j));
            if (ge ? c >= theta : c > theta) { r = j; break; }
        }
        sh.result = r;
        sh.path |= PATH_SEQUENTIAL;
    }
    __syncthreads();
    const int r = sh.result;
    __syncthreads();
    return r;
}

// Steps 4b-4d of the host pipeline over the first n_avail of K sorted candidates. Returns the
// token, or NEED_SORT when the answer lies past the sorted prefix.
template <class View>
__device__ int finish(const View& v, int n_avail, int K, double wsum, int count_all,
                      const Row& p, double u, int slack, Shared& sh) {
    int keep = K;
    if (p.top_p < 1.0) {
        const Shares<View> q = {v, wsum};
        int r = cross(q, n_avail, p.top_p, 0.0, true, -1.0, slack, sh);
        if (r == AMBIGUOUS) r = cross_sequential(q, n_avail, p.top_p, true, -1.0, sh);
        if (r < n_avail) keep = r + 1;
        else if (n_avail < K) return NEED_SORT;
    }
    if (p.min_p > 0.0) {
        int cnt = count_all;
        if (keep <= n_avail) {
            int c = 0;
            for (int j = threadIdx.x; j < keep; j += THREADS) c += v.weight(j) >= p.min_p;
            cnt = block_sum_i(c, sh);
        }
        keep = min(keep, max(1, cnt));
        if (keep > n_avail && keep < K) return NEED_SORT;
    }
    const Weights<View> w = {v};
    if (keep <= n_avail) {
        int r = cross(w, keep, 0.0, 0.0, false, u, slack, sh);
        if (r == AMBIGUOUS) r = cross_sequential(w, keep, 0.0, false, u, sh);
        return v.token(min(r, keep - 1));
    }
    // keep == K and only a prefix is sorted: the total is the (tree) sum of all K weights.
    const double theta = __dmul_rn(u, wsum);
    const double tband = u * band(K, wsum, slack) + theta * 4.440892098500626e-16;
    const int r = cross(w, n_avail, theta, tband, false, -1.0, slack, sh);
    if (r == AMBIGUOUS || r >= n_avail) return NEED_SORT;
    return v.token(r);
}

// ---- one row --------------------------------------------------------------------------------
// keys[i] = okey(x_i [/ T]) with penalties and masking applied to the entries' ids.
__device__ void write_keys(const float* raw, int V, const Row& p, const int* ent, u64* keys,
                           bool greedy) {
    // x / 1.0 == x exactly, so the greedy keys are RawKeys with t = 1.
    const RawKeys rk = {raw, greedy ? 1.0 : p.temp};
    sweep(V, rk, [&](int i, bool ok, u64 k) {
        if (ok) keys[i] = k;
    });
    __syncthreads();
    for (int e = threadIdx.x; e < p.count; e += THREADS) {
        const int* q = ent + 4 * (i64)(p.first + e);
        const int id = q[0], flags = q[2];
        double x = (double)raw[id];
        if (flags & E_REP) x = x > 0.0 ? __ddiv_rn(x, p.rep) : __dmul_rn(x, p.rep);
        if (flags & E_PEN) x = __dsub_rn(x, __dadd_rn(p.pres, __dmul_rn(p.freq, (double)q[1])));
        if (flags & E_MASK) x = neg_inf();
        keys[id] = okey(greedy ? x : __ddiv_rn(x, p.temp));
    }
    __syncthreads();
}

__device__ int sample_random(const float* raw, int V, const Row& p, u64* keys, u64* keys2,
                             u32* ids1, u32* ids2, Shared& sh) {
    const int K = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
    const int slack = V / THREADS + 64;
    if (K > CAP && K < V) {
        restrict_to_top(keys, V, K, sh);
        if (threadIdx.x == 0) sh.path |= PATH_TOP_K;
    }
    // K <= CAP: all K candidates, sorted. Otherwise the best FIRST_TIER, then CAP, then all:
    // a chat model's step usually decides within the first few candidates, and the sort is
    // the costliest stage (a bitonic sort of 2048 keys in shared memory: ~50 us).
    int n_sel = K <= CAP ? K : FIRST_TIER;
    const ScratchKeys kf = {keys};
    select_top(kf, V, n_sel, sh);
    const double y0 = okey_value(sh.big.f.key[0]);
    for (int j = threadIdx.x; j < n_sel; j += THREADS) sh.big.f.w[j] = weight_of(sh.big.f.key[j], y0);
    __syncthreads();
    double s = 0.0;
    int c = 0;
    if (K <= CAP) {
        for (int j = threadIdx.x; j < K; j += THREADS) s = __dadd_rn(s, sh.big.f.w[j]);
    } else {
        sweep(V, kf, [&](int, bool ok, u64 k) {
            if (ok && k != 0ull) {
                const double w = weight_of(k, y0);
                s = __dadd_rn(s, w);
                c += w >= p.min_p;
            }
        });
    }
    const double wsum = block_sum_d(s, sh);
    const int count_all = block_sum_i(c, sh);
    const double u = uniform01(p.seed, p.counter);
    const SmemView fast = {sh.big.f.key, sh.big.f.id, sh.big.f.w};
    int token = finish(fast, n_sel, K, wsum, count_all, p, u, slack, sh);
    if (token == NEED_SORT && n_sel < CAP) {
        if (threadIdx.x == 0) sh.path |= PATH_WIDE;
        n_sel = CAP;
        select_top(kf, V, n_sel, sh);
        for (int j = threadIdx.x; j < n_sel; j += THREADS) sh.big.f.w[j] = weight_of(sh.big.f.key[j], y0);
        __syncthreads();
        token = finish(fast, n_sel, K, wsum, count_all, p, u, slack, sh);
    }
    if (token != NEED_SORT) return token;
    if (threadIdx.x == 0) sh.path |= PATH_SORT;
    const u64* sk;
    const u32* si;
    full_sort(keys, keys2, ids1, ids2, V, sh, sk, si);
    __syncthreads();
    const GlobalView all = {sk, si, y0};
    return finish(all, K, K, wsum, count_all, p, u, slack, sh);
}

__device__ void write_logprobs(const float* raw, int V, int N, int token, i64* out, Shared& sh) {
    const RawValues rv = {raw};
    double m = neg_inf();
    sweep(V, rv, [&](int, bool ok, double x) {
        if (ok) m = fmax(m, x);
    });
    m = block_max_d(m, sh);
    double s = 0.0;
    sweep(V, rv, [&](int, bool ok, double x) {
        if (ok) s = __dadd_rn(s, exp(__dsub_rn(x, m)));
    });
    const double lse = log(block_sum_d(s, sh));
    if (N > 0) {
        const LogprobKeys kf = {raw, m, lse};
        select_top(kf, V, N, sh);
    }
    if (threadIdx.x == 0) {
        int cnt = 0;
        bool seen = false;
        for (int j = 0; j < N; ++j) {
            const int id = (int)sh.big.f.id[j];
            seen = seen || id == token;
            out[1 + cnt] = id;
            out[1 + LP_MAX + cnt] = __double_as_longlong(logprob_of(raw[id], m, lse));
            ++cnt;
        }
        if (!seen) {
            out[1 + cnt] = token;
            out[1 + LP_MAX + cnt] = __double_as_longlong(logprob_of(raw[token], m, lse));
            ++cnt;
        }
        out[0] = cnt;
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(THREADS)
sample_rows(const float* __restrict__ logits, int V, const i64* __restrict__ meta, int R,
            u64* keys_all, u64* keys2_all, u32* ids1_all, u32* ids2_all, int* tokens, i64* lp,
            int* paths) {
    __shared__ Shared sh;
    const int* ent = (const int*)(meta + (i64)ROW_WORDS * R);
    const i64 slot = (i64)blockIdx.x * V;
    u64* keys = keys_all + slot;
    for (int r = blockIdx.x; r < R; r += gridDim.x) {
        const Row p = load_row(meta, r);
        const float* raw = logits + (i64)p.logits_row * V;
        const bool greedy = p.temp == 0.0;
        int token;
        if (threadIdx.x == 0) sh.path = greedy && p.count == 0 ? PATH_GREEDY : 0;
        // Greedy: a block argmax; ascending i per thread with a strict > keeps the lowest id.
        u64 bk = 0ull;
        int bi = BIG_INT;
        const auto best = [&](int i, bool ok, u64 k) {
            if (ok && k > bk) { bk = k; bi = i; }
        };
        if (greedy && p.count == 0) {
            const RawKeys rk = {raw, 1.0};
            sweep(V, rk, best);
            token = block_best(bk, bi, sh);
        } else {
            write_keys(raw, V, p, ent, keys, greedy);
            if (greedy) {
                const ScratchKeys kf = {keys};
                sweep(V, kf, best);
                token = block_best(bk, bi, sh);
            } else {
                token = sample_random(raw, V, p, keys, keys2_all + slot, ids1_all + slot,
                                      ids2_all + slot, sh);
            }
        }
        if (threadIdx.x == 0) {
            tokens[r] = token;
            paths[r] = sh.path;
        }
        if (p.num_lp >= 0) write_logprobs(raw, V, p.num_lp, token, lp + (i64)r * LP_WORDS, sh);
        __syncthreads();
    }
}

// The raw counter-based draws, for checking them against crucible/engine/rng.py bit for bit.
extern "C" __global__ void rng_draws(const u64* __restrict__ seeds, const u64* __restrict__ counters,
                                     u64* bits, double* uniforms, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    bits[i] = random_bits(seeds[i], counters[i]);
    uniforms[i] = uniform01(seeds[i], counters[i]);
}
