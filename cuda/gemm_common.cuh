// gemm_common.cuh: pieces of the canonical GEMM order for the decode-size kernels
// (linear_rows.cu). The order itself is stated in linear.cu.
// No standard headers (NVRTC).
#pragma once

#define CRU_KC 64  // K chunk: partials are sequential fma chains over 64 k, totals add in order

// Four int8 codes -> four exact floats without the int-to-float converter (a quarter-rate
// unit): flip each byte's sign bit (b + 128 in 0..255), splice it under 0x4B000000 (the
// float 2^23, whose last mantissa byte is then that value), and subtract 2^23 + 128. Every
// step is exact, so the result equals (float)(signed char)b.
__device__ __forceinline__ void cru_unpack(int v, float* f) {
    const unsigned u = (unsigned)v ^ 0x80808080u;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        f[i] = __fsub_rn(__uint_as_float(__byte_perm(u, 0x4B000000u, i | 0x7540)), 8388736.0f);
}

// int8: the chunk total times the channel's scale; f32: the total itself.
template <typename T>
__device__ __forceinline__ float cru_rows_finish(float total, float sc) {
    return sizeof(T) == 1 ? __fmul_rn(total, sc) : total;
}
