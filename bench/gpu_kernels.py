"""Per-kernel GPU time of one decode layer's kernels, measured the way decode runs them.

    python3 bench/gpu_kernels.py [--json PATH] [--reps 50]

Each kernel is launched ``reps`` times inside one CUDA graph and the graph is replayed; the
time per launch is (replay time) / reps, which includes the graph's per-node cost, exactly
as a decode step pays it. An empty kernel gives that per-node floor. Each kernel is timed
twice: launched plainly, and with programmatic dependent launch (PDL, crucible/kernels/launch.py), where
each launch's prologue overlaps the previous launch. Shapes are the default
model's (SmolLM2-135M: hidden 576, 9/3 heads of 64, FFN 1536, vocab 49152) with random int8
weights, at batch 1 and 64 and a 192-token history. Figures: min and median over rounds.
Then the LM head around its tiled switch-over, and the decode GEMMs on the row kernels vs
the chunk-parallel kernel at 8..64 rows and both tile widths (to set CHUNKS_FROM and NT).
At batch 1 also the decode stack's kernels and a layer of each kind, in both GEMM orders'
forms (int8: the MMA forms of CRUCIBLE_GEMM=mma beside linear.cu's). Caveat: a kernel
repeated in one graph re-reads the same weights, which then come from L2 (50 MB), not
DRAM as in a real step; the step benches (gpu_step.py, gpu_generate.py) measure that.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from common import SMOLLM2, stat, write_json

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.checks.attention_bench import capture_repeated, replay_us
from crucible.engine.runner import ModelRunner
from crucible.kernels import linear as ck
from crucible.kernels import linear_chunks as cc
from crucible.kernels import linear_rows as cf
from crucible.kernels.device_weight import codes_bf16
from crucible.model.tiny import tiny_random_model

LAYERS = dict(SMOLLM2, n_layers=2)  # kernels are timed one at a time: two layers suffice


def time_graph(fn: Callable[[], Any], reps: int, rounds: int) -> list[float]:
    """Microseconds per launch of ``fn`` over ``rounds`` replays of a ``reps``-launch graph."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    graph = capture_repeated(fn, reps, stream)
    return [replay_us(graph, reps, stream) for _ in range(rounds)]


def kernels(be: Any, meta: Any, m: int) -> dict[str, Callable[[], Any]]:
    import cupy as cp

    cfg = be.cfg
    x = cp.asarray(np.random.default_rng(0).standard_normal((m, cfg.hidden_size)),
                   dtype=cp.float32)
    q = be.attn_in(x, 0, meta)
    act = be.mlp_in(x, 0)
    empty = cp.RawKernel('extern "C" __global__ void nop() {}', "nop")
    return {
        "empty kernel (graph node floor)": lambda: empty((1,), (32,), ()),
        "norm+qkv+rope_kv_store": lambda: be.attn_in(x, 0, meta),
        "attention": lambda: be.attention(q, 0, meta),
        "o (+residual)": lambda: be.linear_add(q, "l0.o", x),
        "norm+gate_up+swiglu": lambda: be.mlp_in(x, 0),
        "down (+residual)": lambda: be.linear_add(act, "l0.down", x),
        "final norm + lm_head": lambda: be.norm_linear(x, "final_norm", "lm_head"),
        "rmsnorm alone": lambda: be.rmsnorm(x, "l0.attn_norm"),
    } | (stack_kernels(be, meta, x, q, act) if m == 1 else {})


def stack_kernels(be: Any, meta: Any, x: Any, q: Any, act: Any) -> dict[str, Callable[[], Any]]:
    """The batch-1 decode stack's kernels (kernels/decode_stack.py) and one layer of each kind,
    its three kernels against the five it replaces (launched back to back in the graph)."""
    from crucible.kernels import decode_stack as ds

    cfg, d = be.cfg, be.cfg.hidden_size
    wo, gu, down = (be.weight(f"l0.{w}") for w in ("o", "gate_up", "down"))
    out, o_parts = be.new(q.shape), be.new((cfg.n_heads, 1, d))
    h, r, y, d_parts = be.new((1, d)), be.new((1, d)), be.new((1, d)), be.new((24, 1, d))
    d_parts[...] = 0

    def qkv(mma: bool = False) -> None:
        be.attn_in(x, 0, meta, parts=d_parts, pscale=down.scale, x_out=r, mma=mma)

    def attn_o(mma: bool = False, split: int | None = None) -> None:
        ds.attention_o(q, be.k_pool, be.v_pool, 0, meta, wo, out, o_parts, cfg.n_heads,
                       cfg.n_kv_heads, pdl=be.options.pdl, mma=mma, split=split)

    def mlp(mma: bool = False, pair: bool | None = None) -> None:
        ds.decode_mlp(x, o_parts, wo.scale, h, be.norm("l0.ffn_norm"), cfg.rms_eps, gu, down,
                      d_parts, pdl=be.options.pdl, mma=mma, pair=pair)

    def five() -> None:
        be.attn_in(x, 0, meta)
        be.attention(q, 0, meta)
        be.linear_add(q, "l0.o", x)
        be.mlp_in(x, 0)
        be.linear_add(act, "l0.down", x)

    # The MMA forms (the stack under CRUCIBLE_GEMM=mma, int8) beside the fma forms, so each
    # kernel's cost of the tensor-core order shows in the same run.
    mma_forms = {} if be.mode != "int8" else {
        "stack mma: norm+qkv+rope_kv_store + 24-partial combine": lambda: qkv(True),
        "stack mma: attention + O partials": lambda: attn_o(True, 1),
        "stack mma: attention + O partials, O split over 2 CTAs": lambda: attn_o(True, 2),
        "stack mma: decode_mlp (9-partial combine, gate/up, down partials)":
            lambda: mlp(True, False),
        "stack mma: decode_mlp_pair (clusters of two CTAs)": lambda: mlp(True, True),
        "layer: stack mma, three kernels": lambda: (qkv(True), attn_o(True), mlp(True))}
    return {"stack: norm+qkv+rope_kv_store + 24-partial combine": qkv,
            "stack: attention + O partials": lambda: attn_o(False, 1),
            "stack: attention + O partials, O split over 2 CTAs": lambda: attn_o(False, 2),
            "stack: decode_mlp (9-partial combine, gate/up, down partials)":
                lambda: mlp(False, False),
            "stack: decode_mlp_pair (clusters of two CTAs)": lambda: mlp(False, True),
            "stack: combine_rows (24 partials)": lambda: ds.combine_rows(
                h, d_parts, down.scale, y, pdl=be.options.pdl),
            "layer: five kernels": five,
            "layer: stack, three kernels": lambda: (qkv(), attn_o(), mlp())} | mma_forms


def rows_vs_chunks(be: Any, reps: int, rounds: int) -> dict[str, dict]:
    """The decode GEMMs on the row kernels (linear_rows) vs the chunk kernel (linear_chunks) at
    both tile widths, PDL on, around linear_chunks.CHUNKS_FROM: gate/up (norm + SwiGLU: the
    fused row kernel vs rmsnorm_rows + chunks), down and O (+ residual)."""
    import cupy as cp

    cfg, out = be.cfg, {}
    gate_up, down, o = (be.weight(f"l0.{w}") for w in ("gate_up", "down", "o"))
    norm = be.norm("l0.ffn_norm")
    for m in (8, 16, 32, 64):
        rng = np.random.default_rng(m)
        x = cp.asarray(rng.standard_normal((m, cfg.hidden_size)), dtype=cp.float32)
        act = cp.asarray(rng.standard_normal((m, cfg.ffn_size)), dtype=cp.float32)
        y_act, y = cp.empty_like(act), cp.empty_like(x)
        cases = {
            "gate_up rows (norm fused)": lambda: cf.linear_rows(
                x, gate_up, y_act, norm=norm, eps=cfg.rms_eps, epi=cf.EPI_SWIGLU, pdl=True),
            "down rows": lambda: cf.linear_rows(act, down, y, residual=x, pdl=True),
            "o rows": lambda: cf.linear_rows(x, o, y, residual=x, pdl=True),
        }
        for nt in cc.NT_CHOICES:
            cases[f"gate_up norm + chunks nt{nt}"] = lambda nt=nt: cc.linear_chunks(
                be.rmsnorm(x, "l0.ffn_norm"), gate_up, y_act, epi=cc.EPI_SWIGLU, nt=nt, pdl=True)
            cases[f"down chunks nt{nt}"] = lambda nt=nt: cc.linear_chunks(act, down, y, x, nt=nt,
                                                                           pdl=True)
            cases[f"o chunks nt{nt}"] = lambda nt=nt: cc.linear_chunks(x, o, y, x, nt=nt,
                                                                        pdl=True)
        for name, fn in cases.items():
            us = time_graph(fn, reps, rounds)
            out[f"b{m} {name} [pdl]"] = stat(us)
            print(f"b{m} {name:40s} {min(us):8.2f} us  (median {np.median(us):.2f})",
                  file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="bench/gpu-kernels.json")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--history", type=int, default=192)
    p.add_argument("--stack-only", action="store_true",
                   help="only batch 1's decode-stack kernels and layers (both orders' forms)")
    args = p.parse_args(argv)
    model = tiny_random_model(seed=1, weights="int8", **LAYERS)
    runner = ModelRunner(model, num_pages=64 * 20, device="cuda")
    be = runner.backend
    be.graphs = None
    import cupy as cp

    # The stack's MMA forms read the codes as bf16, which a backend in the fma order does
    # not upload: layer 0's, added here, so both orders' forms time on one backend.
    for name in ("l0.qkv", "l0.o", "l0.gate_up", "l0.down"):
        wd = be.weight(name)
        be._linear[name] = replace(wd, wb=cp.asarray(codes_bf16(wd.w.get())))

    res: dict[str, dict] = {}
    for m in (1,) if args.stack_only else (1, 64):
        n_pages = -(-(args.history + 1) // 16)
        batch = build_packed_batch([SegmentSpec(f"r{i}", [7], args.history,
                                                list(range(i * 20, i * 20 + n_pages)), [0])
                                    for i in range(m)])
        meta = be.prepare(batch)
        cases = kernels(be, meta, m)
        if args.stack_only:
            cases = {k: v for k, v in cases.items() if k.startswith(("stack", "layer"))}
        for name, fn in cases.items():
            for pdl in (False, True):  # the same graph captured with and without PDL
                be.set_pdl(pdl)
                us = time_graph(fn, args.reps, args.rounds)
                tag = f"b{m} {name}" + (" [pdl]" if pdl else "")
                res[tag] = stat(us)
                print(f"{tag:48s} {min(us):8.2f} us  (median {np.median(us):.2f})",
                      file=sys.stderr, flush=True)
    # The LM head (final norm + 49152 x 576) on the row kernels vs norm + the tiled kernel,
    # around the switch-over (linear.HEAD_TILED_FROM), with PDL (the loop above ends on it).
    for m in () if args.stack_only else (8, 16, 32, 64):
        x = cp.asarray(np.random.default_rng(m).standard_normal((m, be.cfg.hidden_size)),
                       dtype=cp.float32)
        head, norm = be.weight("lm_head"), be.norm("final_norm")
        logits = cp.empty((m, be.cfg.vocab_size), cp.float32)
        cases = {"rows": lambda: cf.linear_rows(x, head, logits, norm=norm, eps=be.cfg.rms_eps,
                                                pdl=True),
                 "norm + tiled": lambda: ck.linear(be.rmsnorm(x, "final_norm"), head, logits,
                                                   tiled=True, pdl=True)}
        for name, fn in cases.items():
            us = time_graph(fn, args.reps, args.rounds)
            res[f"b{m} lm_head {name}"] = stat(us)
            print(f"b{m} lm_head {name:40s} {min(us):8.2f} us", file=sys.stderr, flush=True)
    if not args.stack_only:
        res.update(rows_vs_chunks(be, args.reps, args.rounds))
    write_json(args.json, {"command": "python3 bench/gpu_kernels.py " +
                           " ".join(argv or sys.argv[1:]), "history": args.history,
                           "us_per_launch": res, "time": time.strftime("%Y-%m-%d %H:%M")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
