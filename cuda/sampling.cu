// sampling.cu: the device sampler, crucible/engine/sampling.py's pipeline in f64 on the GPU.
// (Block-wide helpers: sampling_block.cuh; radix select and sorts: sampling_select.cuh.)
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
//     weights. If only the draw is left and it lies past the first FIRST_TIER (nothing
//     truncated), narrowing the key range by weight finds it (sampling_narrow.cuh). Any
//     other answer beyond the sorted prefix, and whatever narrowing cannot decide, falls
//     back to a stable block LSD radix sort of all V (key, id) pairs in scratch and repeats
//     the same steps.
//   u = uniform(seed, n) is computed here with SplitMix64 (crucible/engine/rng.py).
//   logprobs: log-softmax of the raw logits ((x - max) - log(sum exp(x - max))), top-N by
//     (logprob desc, id asc) via the same radix select, plus the sampled token.
// Explicit-rounding intrinsics spell out every f64 step whose rounding a result depends on.

#include "sampling_select.cuh"

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
// off0 (known within its own band) is added before every prefix and base to every index:
// the terms are ranks base .. base + n - 1 of the whole order (cuda/sampling_narrow.cuh).
template <class A>
__device__ int cross(const A& a, int n, double theta, double tband, bool ge, double u_total,
                     int slack, Shared& sh, double off0 = 0.0, int base = 0) {
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
        // off0 = 0 adds nothing (0 + off == off), so the plain calls keep their bits.
        const double p = __dadd_rn(__dadd_rn(off0, off), part), b = band(base + j, p, slack);
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

#include "sampling_narrow.cuh"

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
    // Nothing truncated past the first 256 (keep == K): only the draw's crossing is left to
    // find, and narrowing finds it without sorting (sampling_narrow.cuh). finish()'s last
    // branch bounds theta the same way.
    const bool whole = p.top_p >= 1.0 && (p.min_p <= 0.0 || max(1, count_all) >= K);
    if (token == NEED_SORT && n_sel < CAP && whole) {
        if (threadIdx.x == 0) sh.path |= PATH_NARROW;
        const double theta = __dmul_rn(u, wsum);
        const double tband = u * band(K, wsum, slack) + theta * 4.440892098500626e-16;
        token = draw_narrowed(keys, V, y0, theta, tband, slack, sh);
    } else if (token == NEED_SORT && n_sel < CAP) {
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
