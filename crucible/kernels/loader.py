"""Compile ``cuda/attention.cu`` once per process and hand out its kernels.

One module (``source.KernelModule``) holds every attention kernel: the reference and each
``attn_exact<Q, KT>`` / ``attn_online<Q, KT>`` template instantiation, named through NVRTC
name expressions and built as a few programs of at most ``source.SPLIT_NAMES`` each. Each
is built on first use or by the start-up prebuild (backend/cupy_prebuild.py), so CPU-only
machines import this file without CuPy. Resource figures come from the driver's function
attributes, which is what the check command prints.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from crucible.kernels.source import KernelModule, cached_module
from crucible.kernels.variants import (
    DECODE_GROUPS,
    PREFETCH_VARIANT,
    ROPE_IN_GROUPS,
    Variant,
    all_variants,
)

SOURCE = "attention.cu"


def kernel_name(variant: Variant, prefetch: bool = False) -> str:
    """The name expression of a variant's kernel (also its lookup key); ``prefetch``: the
    exact q4-k64 instance that loads each tile a tile ahead (variants.plan_launch)."""
    if variant.family == "reference":
        return "attn_reference"
    if variant.family == "exact":
        if prefetch:
            if variant != PREFETCH_VARIANT:
                raise ValueError(f"no prefetching instance of {variant.name}")
            return "attn_exact_pf"
        cache = "true" if variant.cache else "false"
        return f"attn_exact<{variant.rows}, {variant.tile}, {cache}>"
    return f"attn_online<{variant.rows}, {variant.tile}>"


def _cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415  (optional dependency: imported only when needed)
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError("CUDA attention needs CuPy (pip install crucible-llm[cuda])") from exc
    return cupy


def attention_module() -> KernelModule:
    """Every variant's kernel, instantiated; each part compiled once per process."""
    _cupy()  # a clear error without CuPy
    names = tuple(kernel_name(v) for v in all_variants())
    return cached_module(SOURCE, names + (kernel_name(PREFETCH_VARIANT, prefetch=True),))


def decode_module() -> KernelModule:
    _cupy()
    names = [f"attn_decode<{g}, 0>" for g in DECODE_GROUPS]
    names += [f"attn_decode<1, {ow}>" for ow in DECODE_O_WEIGHT_BYTES]
    names.append("attn_decode<1, 1, true>")  # the mma order's O partials (int8 W_o)
    names += [f"attn_decode<{g}, 0, false, true>" for g in ROPE_IN_GROUPS]
    return cached_module("attention_decode.cu", tuple(names))


DECODE_O_WEIGHT_BYTES = (1, 4)  # attn_decode<1, OW>: O partials for int8 (1) or f32 (4) W_o


@functools.cache  # one RawKernel per form: its shared-memory opt-in is set on that object
def decode_kernel(heads: int = 1, o_weight_bytes: int = 0, mma: bool = False,
                  rope: bool = False) -> Any:
    """attn_decode<heads, OW> (cuda/attention_decode.cu): the exact family's launch for
    decode steps, ``heads`` query heads of one KV head per CTA; ``o_weight_bytes`` (1 or 4,
    one head per CTA) also leaves the O projection's chunk partials (the decode stack);
    ``mma`` (int8 W_o only) leaves them in the tensor-core order instead. ``rope``: the
    RoPE-in form (a group a CTA, ``ROPE_IN_GROUPS``), which rotates and stores the step's
    K/V itself from the raw QKV."""
    if rope:
        if heads not in ROPE_IN_GROUPS or o_weight_bytes or mma:
            raise ValueError(f"attn_decode's RoPE-in form is built for {ROPE_IN_GROUPS} heads "
                             f"per CTA without O partials, not {heads}/{o_weight_bytes}")
        return decode_module().get_function(f"attn_decode<{heads}, 0, false, true>")
    if heads not in DECODE_GROUPS:
        raise ValueError(f"attn_decode is built for {DECODE_GROUPS} heads per CTA, not {heads}")
    if o_weight_bytes and (heads != 1 or o_weight_bytes not in DECODE_O_WEIGHT_BYTES):
        raise ValueError(f"attn_decode's O partials are built for one head per CTA and "
                         f"{DECODE_O_WEIGHT_BYTES}-byte weights, not {heads}/{o_weight_bytes}")
    if mma:
        if o_weight_bytes != 1:
            raise ValueError("attn_decode's mma-order O partials take int8 W_o (1-byte "
                             f"weights), not {o_weight_bytes}-byte")
        return decode_module().get_function("attn_decode<1, 1, true>")
    return decode_module().get_function(f"attn_decode<{heads}, {o_weight_bytes}>")


@functools.cache
def attention_kernel(variant: Variant, prefetch: bool = False) -> Any:
    return attention_module().get_function(kernel_name(variant, prefetch))


@functools.cache
def sm_count() -> int:
    """Multiprocessors of the current device (cudaDevAttrMultiProcessorCount is 16); asked
    once per device (the GEMM wrappers ask at every launch)."""
    return _sm_count(int(_cupy().cuda.runtime.getDevice()))


@functools.cache
def _sm_count(device: int) -> int:
    return int(_cupy().cuda.runtime.deviceGetAttribute(16, device))


@functools.cache
def l2_bytes() -> int:
    """L2 cache bytes of the current device (cudaDevAttrL2CacheSize is 38)."""
    cupy = _cupy()
    return int(cupy.cuda.runtime.deviceGetAttribute(38, cupy.cuda.runtime.getDevice()))


@functools.cache
def smem_optin_limit() -> int:
    """Largest dynamic shared memory one CTA may opt into on the current device."""
    cupy = _cupy()
    # cudaDevAttrMaxSharedMemoryPerBlockOptin is enum value 97 in every CUDA release since
    # 9.0; asking the runtime directly avoids depending on CuPy's attribute-dict spelling.
    device = cupy.cuda.runtime.getDevice()
    return int(cupy.cuda.runtime.deviceGetAttribute(97, device))


def ensure_dynamic_smem(kernel: Any, nbytes: int) -> None:
    """Raise the kernel's dynamic shared memory ceiling when a launch needs it: the default
    48 KiB bounds static plus dynamic shared memory together (a launch past it fails with
    CUDA_ERROR_INVALID_VALUE)."""
    if nbytes + kernel.shared_size_bytes > 48 * 1024 and \
            kernel.max_dynamic_shared_size_bytes < nbytes:
        kernel.max_dynamic_shared_size_bytes = nbytes


@dataclass(frozen=True)
class KernelResources:
    name: str
    registers: int
    static_smem: int
    local_bytes: int
    max_threads: int


def kernel_resources(variant: Variant) -> KernelResources:
    k = attention_kernel(variant)
    return KernelResources(variant.name, int(k.num_regs), int(k.shared_size_bytes),
                           int(k.local_size_bytes), int(k.max_threads_per_block))
