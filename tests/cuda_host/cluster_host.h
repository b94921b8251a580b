// cluster_host.h: thread-block clusters of two on the host, for prelude.h (which includes
// it last): cluster.cuh's operations and run_grid_cluster2, so decode_stack.cu's
// decode_mlp_pair runs under the host shim as its other kernels do.
#pragma once

// cluster.cuh on the host (run_grid_cluster2): the rank, the cluster barrier's two halves
// (one std::barrier over both CTAs' threads) and a store into the peer's shared memory at
// the same offset.
inline thread_local unsigned cru_host_rank = 0;
inline thread_local unsigned char* cru_host_peer_smem[2] = {nullptr, nullptr};
inline thread_local std::barrier<>* cru_host_cluster_bar = nullptr;
inline thread_local std::optional<std::barrier<>::arrival_token> cru_host_token;
inline unsigned cru_cluster_rank() { return cru_host_rank; }
inline void cru_cluster_arrive() { cru_host_token.emplace(cru_host_cluster_bar->arrive()); }
inline void cru_cluster_wait() {
    cru_host_cluster_bar->wait(std::move(*cru_host_token));
    cru_host_token.reset();
}
inline void cru_st_peer(void* p, unsigned peer, unsigned v) {
    const long at = static_cast<unsigned char*>(p) - cru_host_smem;
    std::memcpy(cru_host_peer_smem[peer] + at, &v, 4);
}

// Clusters of two CTAs along x (a __cluster_dims__(2, 1, 1) kernel): both CTAs of a cluster
// run at once, each with its own threads, __syncthreads barrier and dynamic shared memory
// (so such a kernel keeps no __shared__ statics), meeting at the cluster barrier; clusters
// run one at a time. t_flat numbers the pair's threads together (the warp slots are per
// warp either way).
template <typename F>
inline void run_grid_cluster2(dim3 grid, dim3 block, F kernel) {
    const int n = block.x * block.y;
    std::barrier<> cta0(n), cta1(n), pair(2 * n);
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::barrier<>*> ptrs;
    for (int w = 0; w < 2 * n / 32; ++w) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        ptrs.push_back(warps.back().get());
    }
    std::vector<unsigned char> smem(2 * 256 * 1024 + 16);
    unsigned char* base = smem.data() + (-reinterpret_cast<uintptr_t>(smem.data()) & 15);
    warp_barriers = ptrs.data();
    gridDim = grid;
    blockDim = block;
    std::vector<std::thread> threads;
    for (int t = 0; t < 2 * n; ++t)
        threads.emplace_back([&, t] {
            const unsigned rank = t / n;
            cta_barrier = rank ? &cta1 : &cta0;
            cru_host_cluster_bar = &pair;
            cru_host_rank = rank;
            cru_host_peer_smem[0] = base;
            cru_host_peer_smem[1] = base + 256 * 1024;
            cru_host_smem = cru_host_peer_smem[rank];
            threadIdx = {(unsigned)(t % n % block.x), (unsigned)(t % n / block.x), 0};
            t_flat = t;
            for (unsigned z = 0; z < std::max(grid.z, 1u); ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; x += 2) {
                        blockIdx = {x + rank, y, z};
                        kernel();
                        pair.arrive_and_wait();  // the next cluster starts once this one finished
                    }
        });
    for (auto& t : threads) t.join();
}
