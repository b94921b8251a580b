// pdl.cuh: programmatic dependent launch (Hopper), the two PTX instructions we use.
//
// A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (only inside
// captured decode graphs, crucible/backend/cupy_launch.py) may start while the previous
// kernel of the stream still runs. Contract of every kernel that includes this file:
//   before cru_pdl_wait(): read only what no kernel of the current step writes (weights,
//     scales, RoPE tables, the step's metadata, K/V of earlier positions); write nothing;
//   cru_pdl_wait(): returns once the previous grid has finished and its writes are visible;
//   cru_pdl_trigger(): lets the next kernel start its own prologue. Called after the wait
//     (right after it, unless the kernel says why later), so when the next kernel starts,
//     every kernel before this one has finished.
// Launched without the attribute (eager steps), both are no-ops. No standard headers.
#pragma once

__device__ __forceinline__ void cru_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void cru_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
