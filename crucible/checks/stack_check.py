"""The batch-1 decode stack (crucible/kernels/decode_stack.py) against the five-kernel
layers, bitwise; part of ``gpu-engine-check``.

  stages    each stack kernel == the stages it replaces, on one decode row:
            attn_decode<1, OW>'s output == the attention stage; decode_mlp's h == the O
            GEMM + residual; combine_rows(decode_mlp's down partials) == the gate/up, SwiGLU,
            down GEMM + residual; the QKV form's combine (q, K/V written, x_out) == the same
            form fed the combined residual. Negative control: O's partials added in
            descending head order must change h.
  forms     attn_decode's O split (one CTA a head, or two with half of O's columns each)
            and decode_mlp_pair (clusters of two CTAs) == the one-CTA forms, bitwise.
  both orders  each check runs under gemm "fma" and (int8) "mma", where the stack runs its
            MMA forms against the mma order's stages; there the fma forms' h must differ
            from the mma O GEMM's (the negative control that the orders really differ).
  steps     whole decode steps at batch 1, stack on vs off: logits and the K/V written,
            bitwise, over histories across the attention tile edges, f32 and int8, and the
            default model's shapes (random weights); graph replays with the stack == eager
            steps without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.model.tiny import tiny_random_model

# The default model's shapes, fewer layers (bench/common.py's SMOLLM2 holds all of them).
SMOLLM2_SHAPES = dict(vocab_size=4096, hidden_size=576, n_layers=3, n_heads=9, n_kv_heads=3,
                      head_dim=64, ffn_size=1536, max_context=8192)
HISTORIES = (1, 2, 17, 127, 128, 129, 256, 257, 300)


def _prefilled(geom: dict, weights: str, rng: np.random.Generator,
               gemm: str = "fma") -> tuple[ModelRunner, list]:
    """A GPU runner (GEMM order ``gemm``) holding one request of 301 tokens' K/V (pages
    shuffled)."""
    model = tiny_random_model(seed=11, weights=weights, **geom)
    runner = ModelRunner(model, num_pages=64, device="cuda", settings=Settings(gemm=gemm))
    tokens = rng.integers(0, model.config.vocab_size, 301).tolist()
    pages = rng.permutation(64)[:20].tolist()
    runner.forward(build_packed_batch([SegmentSpec("p", tokens, 0, pages, [300])]))
    return runner, pages


def _decode(token: int, pos: int, pages: list) -> Any:
    return build_packed_batch([SegmentSpec("d", [token], pos, pages, [0])])


def check_stack_stages(t: Any, name: str, geom: dict, weights: str,
                       rng: np.random.Generator, gemm: str = "fma") -> None:
    import cupy as cp

    from crucible.kernels import decode_stack as ds
    from crucible.kernels import linear_rows as cf

    runner, pages = _prefilled(geom, weights, rng, gemm)
    be, cfg = runner.backend, runner.config
    d, layer = cfg.hidden_size, 1
    mma = be.mma and weights == "int8"  # the MMA forms (cupy_stack.py's pick)
    name = f"{name} {gemm}"
    for pos in HISTORIES:
        meta = be.prepare(_decode(5, pos, pages))
        x = cp.asarray(rng.standard_normal((1, d), dtype=np.float32))
        q = be.attn_in(x, layer, meta)
        wo = be.weight(f"l{layer}.o")
        att = be.attention(q, layer, meta)
        out, parts = be.new(att.shape), be.new((cfg.n_heads, 1, d))
        ds.attention_o(q, be.k_pool, be.v_pool, layer, meta, wo, out, parts, cfg.n_heads,
                       cfg.n_kv_heads, mma=mma)
        t.check(bool(cp.array_equal(out, att)), f"{name} {weights} attention_o == attention, h={pos}")
        # Both O splits (one CTA a head, two with half the columns each): the same bits.
        got = []
        for split in (1, 2):
            o_s, p_s = be.new(att.shape), be.new(parts.shape)
            ds.attention_o(q, be.k_pool, be.v_pool, layer, meta, wo, o_s, p_s, cfg.n_heads,
                           cfg.n_kv_heads, mma=mma, split=split)
            got.append((o_s, p_s))
        t.check(all(bool(cp.array_equal(a, b)) for a, b in zip(got[0], got[1]))
                and bool(cp.array_equal(got[0][1], parts)),
                f"{name} {weights} attention_o split 2 == split 1, h={pos}")
        gu, down = be.weight(f"l{layer}.gate_up"), be.weight(f"l{layer}.down")
        norm = be.norm(f"l{layer}.ffn_norm")
        h, dparts = be.new((1, d)), be.new((gu.shape[0] // 128, 1, d))
        ds.decode_mlp(x, parts, wo.scale, h, norm, cfg.rms_eps, gu, down, dparts, mma=mma)
        # Both forms, one CTA a chunk and clusters of two (decode_mlp_pair): the same bits.
        forms = []
        for pair in (False, True):
            hp, dp = be.new(h.shape), be.new(dparts.shape)
            ds.decode_mlp(x, parts, wo.scale, hp, norm, cfg.rms_eps, gu, down, dp, mma=mma,
                          pair=pair)
            forms.append((hp, dp))
        t.check(all(bool(cp.array_equal(a, b)) for a, b in zip(forms[0], forms[1]))
                and bool(cp.array_equal(forms[0][1], dparts)),
                f"{name} {weights} decode_mlp_pair == decode_mlp, h={pos}")
        ref_h = be.linear_add(att, f"l{layer}.o", x)
        t.check(bool(cp.array_equal(h, ref_h)), f"{name} {weights} decode_mlp h == O + residual, h={pos}")
        swapped = be.new((1, d))
        ds.decode_mlp(x, cp.ascontiguousarray(parts[::-1]), wo.scale, swapped, norm,
                      cfg.rms_eps, gu, down, be.new(dparts.shape), mma=mma)
        t.check(not bool(cp.array_equal(swapped, ref_h)),
                f"{name} {weights} negative control: descending O partials must differ, h={pos}")
        if mma:  # the fma forms' partials, combined, are linear.cu's O: not the mma order's
            fma_parts, h_fma = be.new(parts.shape), be.new((1, d))
            ds.attention_o(q, be.k_pool, be.v_pool, layer, meta, wo, be.new(att.shape),
                           fma_parts, cfg.n_heads, cfg.n_kv_heads)
            ds.decode_mlp(x, fma_parts, wo.scale, h_fma, norm, cfg.rms_eps, gu, down,
                          be.new(dparts.shape))
            t.check(not bool(cp.array_equal(h_fma, ref_h)),
                    f"{name} {weights} negative control: the fma partials must differ, h={pos}")
        y = be.new((1, d))
        ds.combine_rows(h, dparts, down.scale, y)
        ref_y = be.linear_add(be.mlp_in(ref_h, layer), f"l{layer}.down", ref_h)
        t.check(bool(cp.array_equal(y, ref_y)), f"{name} {weights} mlp + combine == down + residual, h={pos}")
        # The QKV form with the combine prologue == the same form fed the combined value.
        r = be.new((1, d))
        kv = (be.k_pool.copy(), be.v_pool.copy())
        q2 = be.attn_in(h, layer, meta, parts=dparts, pscale=down.scale, x_out=r, mma=mma)
        kv_stack = (be.k_pool.copy(), be.v_pool.copy())
        be.k_pool[...], be.v_pool[...] = kv
        q_ref = be.attn_in(ref_y, layer, meta)
        same_kv = all(bool(cp.array_equal(a, b)) for a, b in zip(kv_stack, (be.k_pool, be.v_pool)))
        t.check(bool(cp.array_equal(r, ref_y)) and bool(cp.array_equal(q2, q_ref)) and same_kv,
                f"{name} {weights} QKV combine == QKV of the combined residual, h={pos}")
        # The first layer's QKV gathers its embedding row itself: the batch's id (5), or the
        # previous step's id that feed points at (11, which a gather ignoring feed misses).
        ok = True
        for feed, fed, tok in ((None, None, 5), ([1], [3, 11], 11)):
            g = cf.Gather(be.embedding, meta.token_ids,
                          None if feed is None else cp.asarray(feed, cp.int32),
                          None if fed is None else cp.asarray(fed, cp.int32))
            r = be.new((1, d))
            q3 = be.attn_in(g, layer, meta, x_out=r, mma=mma)
            kv_gather = (be.k_pool.copy(), be.v_pool.copy())
            be.k_pool[...], be.v_pool[...] = kv
            row = cp.ascontiguousarray(be.embedding[tok : tok + 1])
            q_ref = be.attn_in(row, layer, meta)
            ok = ok and bool(cp.array_equal(r, row)) and bool(cp.array_equal(q3, q_ref)) and all(
                bool(cp.array_equal(a, b)) for a, b in zip(kv_gather, (be.k_pool, be.v_pool)))
        t.check(ok, f"{name} {weights} QKV gather == QKV of the embedding row, h={pos}")


def _steps(runner: ModelRunner, pages: list, stack: bool, graphs: bool) -> tuple[list, Any]:
    """Greedy decode from position 301 over the tile edges; logits per step and the pools."""
    be = runner.backend
    be.set_decode_stack(stack)
    saved = be.graphs
    if not graphs:
        be.graphs = None
    k0, v0 = be.k_pool.copy(), be.v_pool.copy()
    token, logits = 7, []
    for pos in range(301, 301 + 6):
        out = runner.forward(_decode(token, pos, pages))
        logits.append(out)
        token = int(np.argmax(out[0]))
    pools = (be.k_pool.copy(), be.v_pool.copy())
    be.k_pool[...], be.v_pool[...] = k0, v0
    be.graphs = saved
    be.set_decode_stack(True)
    return logits, pools


def check_stack_steps(t: Any, name: str, geom: dict, weights: str,
                      rng: np.random.Generator, gemm: str = "fma") -> None:
    import cupy as cp

    runner, pages = _prefilled(geom, weights, rng, gemm)
    name = f"{name} {gemm}"
    off, pools_off = _steps(runner, pages, stack=False, graphs=False)
    for label, graphs in (("eager", False), ("graph", True)):
        on, pools_on = _steps(runner, pages, stack=True, graphs=graphs)
        same = all(np.array_equal(a, b) for a, b in zip(on, off))
        # The engine's pages; the scratch page past them takes the graphs' capture
        # stand-ins (cupy_graphs.py), which eager steps never write.
        same_kv = all(bool(cp.array_equal(a[:-1], b[:-1])) for a, b in zip(pools_on, pools_off))
        t.check(same and same_kv, f"{name} {weights} stack ({label}) == five-kernel layers")


def check_stack(t: Any, rng: np.random.Generator, geoms: dict) -> None:
    for name, geom in {**geoms, "smollm2-shapes": SMOLLM2_SHAPES}.items():
        for weights, gemm in (("f32", "fma"), ("int8", "fma"), ("int8", "mma")):
            check_stack_stages(t, name, geom, weights, rng, gemm)
            check_stack_steps(t, name, geom, weights, rng, gemm)
