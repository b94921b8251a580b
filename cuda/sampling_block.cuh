// sampling_block.cuh: shared pieces of the device sampler (cuda/sampling.cu).
//
// Types and layout constants (the metadata words follow crucible/backend/sampling_meta.py),
// the per-block shared memory, order-preserving f64 keys, SplitMix64 (crucible/engine/rng.py,
// bit for bit), and block-wide reductions and scans over 512 threads. Every reduction is a
// fixed tree: per-thread sums in ascending element order, a warp shuffle tree, then the 16
// warp partials combined in ascending order by one thread.
#pragma once
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
#define PATH_NARROW 32     // the draw past the first 256, located by narrowing (no sort)
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

struct NarrowArrays {  // one narrowing pass: per digit, fixed-point weight sums and counts
    u64 fx[256];
    int n[256];
    u64 above_fx;  // the chosen bucket's: everything above it, then its own count
    int above_n, bucket, inside;
};

struct Shared {
    union {
        FastArrays f;
        SortArrays s;
        NarrowArrays n;
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
