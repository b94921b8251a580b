"""The CuPy backend's batch-1 decode stack: the embedding and every layer of a decode step in
three kernels per layer (kernels/decode_stack.py), on a ``CupyBackend``'s weights and pool.

The first QKV reads its row of the embedding itself (a ``Gather``): no embedding kernel.
Each layer is the fused attention-in row kernel (``CupyBackend.attn_in``, which folds the
previous layer's MLP parts into its prologue), attention with the output projection, and the
decode MLP; the last layer's parts are combined into the residual at the end.
"""

from __future__ import annotations

from typing import Any

from crucible.backend.cupy_meta import CupyMeta
from crucible.kernels import decode_stack as ds
from crucible.kernels import linear_rows as cf


def decode_stack(b: Any, meta: CupyMeta) -> Any:
    """The residual after the last layer of the decode step ``meta`` run as the stack on the
    backend ``b``; None when the stack is off or the step is not its shape."""
    decode = meta.max_chunk == 1 and meta.segments.shape[0] == meta.num_rows
    wbytes = 1 if b.mode == "int8" else 4
    # Under gemm "mma" int8 weights take the tensor-core order (f32 ones keep linear.cu's,
    # so their stack is the fma one); a shape the MMA forms do not take leaves the stack off.
    mma = b.mma and wbytes == 1
    if not (b.use_stack and decode and ds.fits(b.cfg, meta.num_rows, meta.score_capacity,
                                               b.variant, wbytes, mma)):
        return None
    return _stack_layers(b, meta, mma)


def _stack_layers(b: Any, meta: CupyMeta, mma: bool) -> Any:
    """Every layer of a decode step as the stack; returns the residual after the last."""
    cfg, new, pdl = b.cfg, b.new, b.options.pdl
    t, d = meta.num_rows, cfg.hidden_size
    first = cf.Gather(b.embedding, meta.token_ids, meta.feed, meta.fed)
    h, parts, pscale = None, None, None  # the residual stream is h + parts
    for i in range(cfg.n_layers):
        r = new((t, d))
        if parts is None:  # the first layer: the embedding is the residual
            q = b.attn_in(first, i, meta, x_out=r, mma=mma)
        else:
            q = b.attn_in(h, i, meta, parts=parts, pscale=pscale, x_out=r, mma=mma)
        wo = b.weight(f"l{i}.o")
        o_parts = new((cfg.n_heads, t, d))
        ds.attention_o(q, b.k_pool, b.v_pool, i, meta, wo, new((t, cfg.q_dim)),
                       o_parts, cfg.n_heads, cfg.n_kv_heads, pdl=pdl, mma=mma)
        gu, down = b.weight(f"l{i}.gate_up"), b.weight(f"l{i}.down")
        h = new((t, d))
        parts = new((gu.shape[0] // 128, t, d))
        ds.decode_mlp(r, o_parts, wo.scale, h, b.norm(f"l{i}.ffn_norm"), cfg.rms_eps,
                      gu, down, parts, pdl=pdl, mma=mma)
        pscale = down.scale
    out = new((t, d))
    ds.combine_rows(h, parts, pscale, out, pdl=pdl)
    return out
