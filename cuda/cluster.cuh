// cluster.cuh: the thread-block-cluster operations a kernel split over a pair of CTAs uses
// (decode_stack.cu's decode_mlp_pair): the CTA's rank in its cluster, the cluster barrier
// in its two halves, and a store into the peer CTA's shared memory (distributed shared
// memory, sm_90).
//
// Why two halves: a CTA may write its peer's shared memory only once the peer runs, so a
// kernel arrives at the start and waits just before its first remote store, and the
// barrier costs nothing in between. Every thread of both CTAs must arrive and wait (the
// .aligned forms: whole warps). Release/acquire at cluster scope make the stores before an
// arrive visible to the peer's reads after its wait, as __syncthreads does within a CTA.
// The host shim (tests/cuda_host/prelude.h) supplies its own versions. No standard headers.
#pragma once

#ifndef CRU_HOST_SHIM
__device__ __forceinline__ unsigned cru_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cru_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cru_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// *p in CTA `peer` of the cluster (p: this CTA's address of the same variable) = v.
__device__ __forceinline__ void cru_st_peer(void* p, unsigned peer, unsigned v) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(p));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(at), "r"(peer));
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote), "r"(v) : "memory");
}
#endif
