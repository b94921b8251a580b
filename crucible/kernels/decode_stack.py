"""The batch-1 decode stack's kernels (cuda/decode_stack.cu, and attention_decode.cu's
attn_decode<1, OW>): every layer in three kernels instead of five. The CuPy backend runs
them over its layers (CupyBackend.decode_stack); this module binds and checks the launches.

Why: at batch 1 each kernel of a layer is latency-bound (a few microseconds of work each),
so a kernel boundary costs about as much as the work on either side of it. The O and down
GEMMs are folded into the kernels before them, which leave one partial per 64-wide K chunk
instead of the output; the kernel after them adds the partials in the canonical order with
the scale and the residual (cuda/rows_chunk.cuh's cru_combined):

    QKV (linear_rows, RoPE form)  h_prev + down partials -> r (the first layer: r = its
                                  token's embedding row); RMSNorm -> QKV -> RoPE, K/V
    attn_decode<1, OW>            attention; O's partial of head h's chunk, every O column
    decode_mlp                    r + O partials -> h; RMSNorm -> gate/up -> SwiGLU -> down's
                                  partial of its 64 SwiGLU outputs' chunk, every column
    ... and after the last layer  combine_rows: h + down partials -> the final residual

Every output element keeps linear.cu's order (chunk chains from 0, partials added in
ascending chunk order, scale, residual last), so the logits and the K/V written are the
bits of the five-kernel layers; gpu-engine-check compares them. ``CRUCIBLE_DECODE_STACK=0``
turns the stack off.

Under ``CRUCIBLE_GEMM=mma`` (int8 weights) the same three kernels run their MMA forms: each
partial is the GEMM's 64-block value in the tensor-core order (cuda/mma_row.cuh), and the
same combines add them, so the bits are those of the mma order's unfused layers.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from crucible.kernels import linear_mma as lm
from crucible.kernels import linear_rows as cf
from crucible.kernels.attention import decode_args, validate_arguments
from crucible.kernels.device_weight import DeviceWeight, ctype
from crucible.kernels.launch import launch
from crucible.kernels.loader import decode_kernel, ensure_dynamic_smem, smem_optin_limit
from crucible.kernels.source import KernelModule, cached_module
from crucible.kernels.variants import decode_smem_bytes, decode_static_bytes

MAX_ROWS = 1  # the stack re-reads every weight once per row: it pays at batch 1 only
MLP_MAX_K = 576  # decode_mlp's launch bounds: 2 warps per K chunk, 576 threads at most
MLP_STATIC_BYTES = 64  # decode_mlp's static shared memory (48 bytes by ptxas), rounded up

_NAMES = tuple(f"{k}<{ctype(d)}>" for k in ("decode_mlp", "decode_mlp_pair", "combine_rows")
               for d in ("float32", "int8")) + ("decode_mlp<signed char, true>",
                                                "decode_mlp_pair<signed char, true>")
# decode_mlp over clusters of two CTAs (decode_mlp_pair), by GEMM order: the same bits, half
# of each CTA's weights and work (bench/gpu_kernels.py times both forms).
MLP_PAIR = {"fma": False, "mma": True}
# CTAs a head in the stack's attention (attn_decode's O split), by GEMM order: each
# computes the head's attention and its share of O's columns; the same bits.
O_SPLIT = {"fma": 1, "mma": 2}


def module() -> KernelModule:
    return cached_module("decode_stack.cu", _NAMES)


@functools.cache
def _kernel(name: str) -> Any:
    return module().get_function(name)


def _wbytes(wd: DeviceWeight) -> int:
    return 1 if wd.scale is not None else 4


def attention_smem(capacity: int, o_n: int, wbytes: int) -> int:
    """attn_decode<1, OW>'s dynamic shared memory: attn_decode<1>'s plus W_o's chunk."""
    return decode_smem_bytes(capacity, 1) + o_n * 64 * wbytes


def mlp_smem(k: int, n_d: int, wbytes: int, mma: bool, pair: bool) -> int:
    """decode_mlp's (or decode_mlp_pair's) dynamic shared memory, as decode_stack.cu lays
    it out: the pair stages half of down's columns and keeps its reduction scratch (16
    floats) at the head."""
    chunks = -(-k // 64)
    smem = 4 * (2 * k + 2 * chunks * 64 + 64) + (n_d // (2 if pair else 1)) * 64 * wbytes
    if mma:  # the B fragments of every x block and of the SwiGLU outputs, 96 words each
        smem += 384 * (chunks + 1)
    return smem + (64 if pair else 0)


def fits(cfg: Any, rows: int, capacity: int, variant: Any, wbytes: int,
         mma: bool = False) -> bool:
    """Whether a decode step of ``rows`` rows runs as the stack: the exact family, shapes
    the kernels are built for, and W_o's chunk fitting beside attn_decode's own memory.
    ``mma``: the MMA forms, which take int8 weights that all run in the mma order
    (linear_mma.supports); the hidden size, O's and down's columns, is a multiple of 16
    for every form (mma_row.cuh's cru_row_slice takes whole 16-column pairs)."""
    d, f, most = cfg.hidden_size, cfg.ffn_size, cf.COMBINE_MAX_PARTS
    if mma and not (wbytes == 1 and all(lm.supports(n, k) for n, k in (
            ((cfg.n_heads + 2 * cfg.n_kv_heads) * 64, d), (d, cfg.n_heads * 64), (2 * f, d),
            (d, f)))):
        return False  # a weight that keeps linear.cu's order under mma: no MMA stack
    return (1 <= rows <= MAX_ROWS and variant.family == "exact" and cfg.head_dim == 64
            and d % 16 == 0 and d <= MLP_MAX_K and f % 64 == 0 and f // 64 <= most
            and cfg.n_heads <= most
            and attention_smem(capacity, d, wbytes) + decode_static_bytes(1)
            <= smem_optin_limit()
            and mlp_smem(d, d, wbytes, mma, False) + MLP_STATIC_BYTES <= smem_optin_limit())


def attention_o(q: Any, k_pool: Any, v_pool: Any, layer: int, meta: Any, wo: DeviceWeight,
                out: Any, o_parts: Any, n_heads: int, n_kv: int, *, pdl: bool = False,
                mma: bool = False, split: int | None = None) -> None:
    """attn_decode<1, OW>: attention of every row into ``out`` [T, H*64], and O's chunk
    partials into ``o_parts`` [H, T, N_o] (unscaled; the next kernel finishes them). The
    arrays are checked as paged_attention checks them. ``mma``: the partials in the
    tensor-core order (int8 W_o, N_o a multiple of 16). ``split``: CTAs a head, each
    with its share of O's columns (None: O_SPLIT's choice; 1 where N_o does not divide
    into whole columns, or 16-column pairs under mma); the same bits."""
    t, (o_n, o_k) = q.shape[0], wo.shape
    validate_arguments(q, k_pool, v_pool, layer, meta.segments, meta.page_tables, out,
                       n_heads, n_kv, 1, meta.score_capacity)
    if o_k != n_heads * 64 or o_parts.shape != (n_heads, t, o_n):
        raise ValueError(f"attention_o: W_o {wo.shape} and O partials {o_parts.shape} do not "
                         f"fit {n_heads} heads of 64 and {t} rows")
    wb = _wbytes(wo)
    if mma and (wb != 1 or o_n % 16):
        raise ValueError(f"attention_o: the mma order takes int8 W_o with whole 16-column "
                         f"pairs, got {wo.dtype_name} {wo.shape}")
    if split is None:
        split = O_SPLIT["mma" if mma else "fma"]
    if split not in (1, 2):
        raise ValueError(f"attention_o: O split {split} is not built (1 or 2)")
    if o_n % (split * (16 if mma else 1)):
        split = 1
    fn = decode_kernel(1, wb, mma)
    smem = attention_smem(meta.score_capacity, o_n // split, wb)
    ensure_dynamic_smem(fn, smem)
    args = decode_args(q, k_pool, v_pool, layer, meta.segments, meta.page_tables, out,
                       n_heads, n_kv, meta.score_capacity, wo.w, o_parts, o_split=split)
    launch(fn, (n_heads * split, t), (256, 1, 1), args, shared_mem=smem, pdl=pdl)


def decode_mlp(r: Any, o_parts: Any, o_scale: Any, h_out: Any, norm: Any, eps: float,
               gu: DeviceWeight, down: DeviceWeight, down_parts: Any, *,
               pdl: bool = False, mma: bool = False, pair: bool | None = None) -> None:
    """h = r + O's partials (stored to ``h_out``); RMSNorm -> gate/up -> SwiGLU -> down's
    chunk partials into ``down_parts`` [F/64, T, N_d]. ``mma``: gate/up and down in the
    tensor-core order (int8, K a multiple of 64, N_d of 16). ``pair``: over clusters of two
    CTAs (decode_mlp_pair; None: MLP_PAIR's choice), the same bits."""
    i32 = np.int32
    t, k = r.shape
    f, n_d = gu.shape[0] // 2, down.shape[0]
    chunks = -(-k // 64)
    wb = _wbytes(gu)
    if mma and (wb != 1 or _wbytes(down) != 1 or k % 64 or n_d % 16):
        raise ValueError(f"decode_mlp: the mma order takes int8 gate/up and down with K % 64 "
                         f"== 0 and whole 16-column pairs, got {gu.dtype_name} {gu.shape}, "
                         f"{down.dtype_name} {down.shape}")
    if pair is None:
        pair = MLP_PAIR["mma" if mma else "fma"]
    # A pair splits down's columns in halves of whole 16-column pairs (mma) or columns.
    pair = pair and n_d % (32 if mma else 2) == 0
    name = "decode_mlp_pair" if pair else "decode_mlp"
    fn = _kernel(f"{name}<signed char, true>" if mma else f"{name}<{ctype(gu.dtype_name)}>")
    smem = mlp_smem(k, n_d, wb, mma, pair)
    ensure_dynamic_smem(fn, smem)
    null = np.uint64(0)
    n_parts = 0 if o_parts is None else o_parts.shape[0]
    args = (r, o_parts if o_parts is not None else null, i32(n_parts),
            o_scale if o_scale is not None and n_parts else null,
            h_out, norm, np.float32(eps), gu.w, gu.scale if gu.scale is not None else null,
            down.w, down_parts, i32(t), i32(k), i32(f), i32(n_d))
    if pair:  # clusters of two along x (the kernel's __cluster_dims__)
        launch(fn, (2 * (f // 64), t), (32, chunks), args, shared_mem=smem, pdl=pdl)
    else:
        launch(fn, (f // 64, t), (32, 2 * chunks), args, shared_mem=smem, pdl=pdl)


def combine_rows(h: Any, parts: Any, scale: Any, out: Any, *, pdl: bool = False) -> None:
    """out = h + the down partials, finished as down's residual epilogue."""
    t, k = h.shape
    fn = _kernel(f"combine_rows<{'signed char' if scale is not None else 'float'}>")
    args = (h, parts, np.int32(parts.shape[0]), scale if scale is not None else np.uint64(0),
            out, np.int32(t), np.int32(k))
    launch(fn, (t,), (256,), args, pdl=pdl)

