// sampling_driver.cpp: cuda/sampling.cu's sample_rows run on the host (prelude.h), driven
// by tests/test_sampler_on_host.py, which checks the ids against the host sampler
// (crucible/engine/sampling.py) with gpu-sampling's own sections.
//
// Usage: sampling_driver IN OUT SLOTS. IN: int32 V, R, logits rows L, meta words W; then
// f32 logits [L, V]; then int64 meta [W] (crucible/step/row_buffer.py's pack_rows). OUT:
// int32 tokens [R], int32 route flags [R], int64 logprob words [R, LP_WORDS]. SLOTS CTAs
// (as CupySampler's grid: CTA b takes rows b, b + SLOTS, ...), each of 512 threads, run one
// after another; the scratch is theirs, [SLOTS, V] each.
#include "prelude.h"
#include "sampling.cu"

#include <cstdio>
#include <vector>

static bool read_all(FILE* f, void* p, size_t n) { return std::fread(p, 1, n, f) == n; }

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: sampling_driver IN OUT SLOTS\n");
        return 2;
    }
    FILE* in = std::fopen(argv[1], "rb");
    int head[4];
    if (!in || !read_all(in, head, sizeof head)) return 2;
    const int V = head[0], R = head[1], L = head[2], W = head[3];
    std::vector<float> logits((size_t)L * V);
    std::vector<i64> meta(W);
    if (!read_all(in, logits.data(), logits.size() * 4) || !read_all(in, meta.data(), meta.size() * 8))
        return 2;
    std::fclose(in);
    const int slots = std::max(1, std::min(R, std::atoi(argv[3])));
    std::vector<u64> keys((size_t)slots * V), keys2((size_t)slots * V);
    std::vector<u32> ids1((size_t)slots * V), ids2((size_t)slots * V);
    std::vector<int> tokens(R), paths(R);
    std::vector<i64> lp((size_t)R * LP_WORDS);
    run_grid(dim3{(unsigned)slots}, dim3{THREADS}, [&] {
        sample_rows(logits.data(), V, meta.data(), R, keys.data(), keys2.data(), ids1.data(),
                    ids2.data(), tokens.data(), lp.data(), paths.data());
    });
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) return 2;
    std::fwrite(tokens.data(), 4, R, out);
    std::fwrite(paths.data(), 4, R, out);
    std::fwrite(lp.data(), 8, lp.size(), out);
    std::fclose(out);
    return 0;
}
