"""attn_exact (the exact tiled prefill attention, exact-q4-k64) of other attention.cu files
against the shipped kernel, in one process: bits compared, alternating order.

    python3 bench/prefill_attention.py --alt old=path/attention.cu [--alt new=...]
        [--prefetch] [--shapes single-1024,2x512] [--rounds 7] [--json bench/x.json]

An ``--alt`` file is a whole attention.cu (same kernel names and arguments) with its
includes inlined or taken from its own directory first, then cuda/ (so a branch's cuda/
directory, copied anywhere, is an alt whole); it is compiled here with the project's
options. With ``--prefetch`` each alt's attn_exact_pf is timed too ("NAME-pf"). Shapes
are gpu-prefill-attention-bench's (checks/attention_suite.py: bench_shapes) and two chat
launches (CHAT_SHAPES) on the default model's geometry (9 query heads over 3 KV heads),
data in layer 1 of a 3-layer pool. Per shape and kernel: us per launch (20 launches
between CUDA events, median and min-max over rounds), whether its output equals the
shipped kernel's bit for bit, and the shipped kernel's time over its own, paired per round
(above 1: this kernel is faster). ``--prefetch`` adds attn_exact_pf ("prefetch").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

import numpy as np

KERNEL = "attn_exact<4, 64, false>"
# A chat server's launches past 1,024 positions (capacity 1,792, two CTAs an SM either way):
# a cohort's 16 slices of 60 after ~1,300 cached positions, a lone 84-row joiner after 1,400.
CHAT_SHAPES = {"chat-cohort-1300": tuple((1240 + 8 * i, 60) for i in range(16)),
               "chat-joiner-1400": ((1400, 84),)}
N_HEADS, N_KV = 9, 3
DEFAULT_SHAPES = "single-1024,2x512,scheduled-4x512-second,4x256,single-256,heterogeneous"


def kernels(cp: Any, alts: dict[str, str], prefetch: bool = False,
            lineinfo: bool = False) -> dict[str, Any]:
    from crucible.kernels.loader import attention_kernel
    from crucible.kernels.source import cuda_source_dir
    from crucible.kernels.variants import parse_variant

    fns = {"shipped": attention_kernel(parse_variant("exact-q4-k64"))}
    # "shipped" is the plain q4-k64 instance; the engine runs the prefetching one at the
    # default model's group (variants.PREFETCH, on since 2026-12-05)
    if prefetch:  # the prefetching instance (attention_prefetch.cuh)
        fns["prefetch"] = attention_kernel(parse_variant("exact-q4-k64"), prefetch=True)
    for name, path in alts.items():
        names = [KERNEL] + (["attn_exact_pf"] if prefetch else [])
        own = os.path.dirname(os.path.abspath(path))
        with open(path) as f:
            mod = cp.RawModule(code=f.read(), name_expressions=names,
                               options=("-std=c++17", f"-I{own}", f"-I{cuda_source_dir()}")
                               + (("-lineinfo",) if lineinfo else ()))
        fns[name] = mod.get_function(KERNEL)
        if prefetch:
            fns[f"{name}-pf"] = mod.get_function("attn_exact_pf")
    return fns


def time_shape(cp: Any, fns: dict[str, Any], shape: str, rounds: int) -> dict[str, Any]:
    from crucible.checks.attention_cases import LAYER, Case, build
    from crucible.checks.attention_check import to_device
    from crucible.checks.attention_suite import bench_shapes
    from crucible.kernels.loader import ensure_dynamic_smem, sm_count, smem_optin_limit
    from crucible.kernels.variants import parse_variant, plan_launch

    slices = {**bench_shapes(), **CHAT_SHAPES}[shape]
    b = build(Case(shape, N_HEADS, N_KV, slices))
    d = to_device(b)
    plan = plan_launch(parse_variant("exact-q4-k64"), n_heads=N_HEADS, n_kv_heads=N_KV,
                       head_dim=64, capacity=b.capacity, smem_limit=smem_optin_limit(),
                       rows=len(slices), sm_count=sm_count())
    grid = (N_KV, -(-b.max_chunk // 4), len(slices))
    i32 = np.int32
    outs = {n: cp.full(d["q"].shape, cp.nan, dtype=cp.float32) for n in fns}
    for f in fns.values():
        ensure_dynamic_smem(f, plan.smem_bytes)

    def run(name: str, iters: int = 1) -> None:
        args = (d["q"], d["k"], d["v"], d["segs"], d["tables"], i32(d["tables"].shape[1]),
                outs[name], i32(N_HEADS), i32(N_KV), i32(3), i32(LAYER), i32(b.capacity))
        for _ in range(iters):
            fns[name](grid, (plan.threads, 1, 1), args, shared_mem=plan.smem_bytes)

    for n in fns:
        run(n)
    ref = outs["shipped"].view(cp.uint32)
    same = {n: bool((outs[n].view(cp.uint32) == ref).all()) for n in fns}
    times: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            run(n, 3)
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            run(n, 20)
            end.record()
            end.synchronize()
            times[n].append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 20)
    entry: dict[str, Any] = {"grid": list(grid), "threads": plan.threads,
                             "smem_bytes": plan.smem_bytes}
    for n, ts in times.items():
        ratios = [a / x for a, x in zip(times["shipped"], ts)]
        entry[n] = {"us": {"median": round(statistics.median(ts), 2), "min": round(min(ts), 2),
                           "max": round(max(ts), 2)},
                    "identical_to_shipped": same[n],
                    "shipped_over_this": {"median": round(statistics.median(ratios), 3),
                                          "min": round(min(ratios), 3),
                                          "max": round(max(ratios), 3)}}
    return entry


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alt", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    p.add_argument("--prefetch", action="store_true",
                   help="also time attn_exact_pf (the prefetching instance)")
    p.add_argument("--lineinfo", action="store_true",
                   help="compile the alts with -lineinfo (for Nsight Compute's source view)")
    args = p.parse_args(argv)
    alts = {}
    for a in args.alt:
        name, sep, path = a.partition("=")
        if not sep or not name or not path or name == "shipped":
            p.error(f"--alt takes NAME=PATH (NAME not 'shipped'), got {a!r}")
        alts[name] = path
    fns = kernels(cp, alts, args.prefetch, args.lineinfo)
    result: dict[str, Any] = {"command": "python3 " + " ".join(sys.argv), "kernel": KERNEL,
                              "shapes": {}}
    for shape in args.shapes.split(","):
        e = result["shapes"][shape] = time_shape(cp, fns, shape, args.rounds)
        print(f"{shape:<24}" + "".join(
            f"  {n} {e[n]['us']['median']:8.2f} us{'' if e[n]['identical_to_shipped'] else ' BITS DIFFER'}"
            f" x{e[n]['shipped_over_this']['median']:.3f}" for n in fns), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
