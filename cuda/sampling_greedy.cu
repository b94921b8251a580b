// sampling_greedy.cu: greedy sampling (temperature 0, no penalty entries, no logprobs) with
// each row split over many CTAs; the token equals sample_rows' greedy branch (sampling.cu).
//
// Layout: logits f32 [rows, V] row-major (4-byte aligned; rows need not be 16-byte aligned);
// meta int64, GREEDY_ROW_WORDS words per sampled row, word GREEDY_LOGITS_ROW = the logits row
// to read (crucible/backend/sampling_meta.py; the entries after the records are not read),
// or null when row r reads logits row r (then the step uploads no metadata at all);
// part u64 [R, S]: one packed (key, id) partial per CTA; counters u32 [R]: zero between
// launches (the last CTA of a row puts it back to 0); tokens int32 [R].
//
// Thread mapping: grid (S, R), GREEDY_THREADS threads. CTA (s, r) scans slice s of row r:
// the elements [head + s * slice, head + (s + 1) * slice) clipped to V, where head (0-3) is
// the number of leading elements before the first 16-byte boundary of the row, so every
// slice starts aligned; `slice` is a multiple of 4. Thread t loads the slice's float4s
// t, t + THREADS, ... (GREEDY_ITEMS in flight before any is used); the last quad's leftover
// 1-3 elements and the row's head elements go to single threads of slices S-1 (wherever the
// row ends) and 0. Then a warp shuffle tree, the warp partials combined in ascending order by
// thread 0, one partial stored; thread 0 publishes it (threadfence, then atomicAdd on
// counters[r]), and the CTA drawing the last ticket combines the row's S partials in a fixed
// order (warp 0: lane l takes s = l, l + 32, ... ascending, then a shuffle tree), writes
// tokens[r] and resets counters[r]. No float atomics: the combine order never depends on
// timing (and the max with a lowest-id tie-break would not depend on order anyway).
//
// The key. sample_rows ranks okey((double)x), the order-preserving u64 of the f64 value with
// -0.0 taken as +0.0. f32 -> f64 is exact and strictly increasing (NaN aside, outside the
// contract), so the same order on f32 bits gives the same argmax: k32 = the f32 pattern with
// -0.0 folded to +0.0 (by bits: a flush-to-zero build must not merge denormals with zero),
// then sign-flipped (positive: set the top bit; negative: invert). The id goes in the low
// half as ~id, so ONE u64 max orders by (key desc, id asc): ties go to the lowest id.
// Every real element packs above 0, the identity of empty slices.

#define GREEDY_THREADS 256
#define GREEDY_WARPS (GREEDY_THREADS / 32)
#define GREEDY_ITEMS 2        // float4 loads per thread in flight: a 2048-element slice is one pass
#define GREEDY_ROW_WORDS 16   // ROW_WORDS in sampling_meta.py
#define GREEDY_LOGITS_ROW 12  // the logits-row word of a row record

typedef unsigned long long gu64;

__device__ __forceinline__ gu64 gmax(gu64 a, gu64 b) { return a > b ? a : b; }

__device__ __forceinline__ gu64 greedy_pack(float x, int i) {
    unsigned int b = __float_as_uint(x);
    b = b == 0x80000000u ? 0u : b;  // -0.0 ties with +0.0, as okey's v + 0.0 does
    const unsigned int k = (b >> 31) ? ~b : (b | 0x80000000u);
    return ((gu64)k << 32) | (gu64)(~(unsigned int)i);
}

__device__ __forceinline__ gu64 warp_max(gu64 v) {
    for (int off = 16; off > 0; off >>= 1) v = gmax(v, __shfl_down_sync(0xffffffffu, v, off));
    return v;
}

extern "C" __global__ void __launch_bounds__(GREEDY_THREADS)
greedy_rows(const float* __restrict__ logits, int V, const long long* __restrict__ meta, int R,
            int S, int slice, gu64* __restrict__ part, unsigned int* __restrict__ counters,
            int* __restrict__ tokens) {
    __shared__ gu64 red[GREEDY_WARPS];
    __shared__ int is_last;
    const int s = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    if (r >= R) return;  // uniform per CTA: a grid larger than R stays harmless
    // No metadata: row r samples logits row r (a decode step's rows, in order).
    const long long lrow =
        meta != nullptr ? meta[(long long)r * GREEDY_ROW_WORDS + GREEDY_LOGITS_ROW] : r;
    const float* row = logits + lrow * V;
    // Elements before the row's first 16-byte boundary (rows of odd V, offset views).
    const int mis = (int)((unsigned long long)row & 15ull);
    const int head = min(V, ((16 - mis) & 15) >> 2);
    const int lo = head + s * slice;
    const int hi = min(V, lo + slice);
    const int nq = hi > lo ? (hi - lo) >> 2 : 0;
    const float4* q4 = reinterpret_cast<const float4*>(row + lo);

    gu64 best = 0ull;
    for (int q0 = tid; q0 < nq; q0 += GREEDY_THREADS * GREEDY_ITEMS) {
        float4 v[GREEDY_ITEMS];
#pragma unroll
        for (int u = 0; u < GREEDY_ITEMS; ++u) {
            const int q = q0 + u * GREEDY_THREADS;
            if (q < nq) v[u] = __ldg(q4 + q);
        }
#pragma unroll
        for (int u = 0; u < GREEDY_ITEMS; ++u) {
            const int q = q0 + u * GREEDY_THREADS;
            if (q < nq) {
                const int i = lo + 4 * q;
                best = gmax(best, greedy_pack(v[u].x, i));
                best = gmax(best, greedy_pack(v[u].y, i + 1));
                best = gmax(best, greedy_pack(v[u].z, i + 2));
                best = gmax(best, greedy_pack(v[u].w, i + 3));
            }
        }
    }
    // The 1-3 elements past the last whole quad (only the slice holding the row's end has any)
    // and, in slice 0, the head.
    const int tail = lo + 4 * nq;
    if (tid < hi - tail) best = gmax(best, greedy_pack(__ldg(row + tail + tid), tail + tid));
    if (s == 0 && tid < head) best = gmax(best, greedy_pack(__ldg(row + tid), tid));

    best = warp_max(best);
    if (lane == 0) red[warp] = best;
    __syncthreads();
    if (tid == 0) {
        gu64 b = red[0];
        for (int w = 1; w < GREEDY_WARPS; ++w) b = gmax(b, red[w]);
        part[(long long)r * S + s] = b;
        __threadfence();  // the partial is visible device-wide before the ticket is drawn
        const unsigned int ticket = atomicAdd(counters + r, 1u);
        is_last = ticket == (unsigned int)(S - 1);
    }
    __syncthreads();
    if (!is_last) return;
    // Every other CTA of row r published its partial before its ticket: read them from L2.
    __threadfence();
    if (warp == 0) {
        gu64 b = 0ull;
        for (int j = lane; j < S; j += 32) b = gmax(b, __ldcg(part + (long long)r * S + j));
        b = warp_max(b);
        if (lane == 0) {
            tokens[r] = (int)(~(unsigned int)b);  // the low half holds ~id
            counters[r] = 0u;  // all S tickets of this launch are drawn: ready for the next
        }
    }
}
