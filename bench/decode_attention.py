"""attn_decode's L2 prefetch budget, A/B on the GPU: the same launches under named budgets,
alternating within each round ("budget": the host's, kernels/attention.py
decode_prefetch_len; "full": every CTA its whole history; "none").

    python3 bench/decode_attention.py --json bench/decode-attention-h200.json
    python3 bench/decode_attention.py --configs budget --cases "256 rows, 400-1200"  # for ncu
    python3 bench/decode_attention.py --alt-source my/attention_decode.cu --configs budget,alt

``g1``: the shipped kernel with one query head a CTA (and that grid's budget) whatever the
host's heads-per-CTA rule (kernels/variants.py decode_heads_per_cta) picks: where the rule
picks the whole group, this times the other side of it.

``--alt-source``: another attention_decode.cu (same kernel names and arguments; includes
from cuda/), compiled here as configuration "alt" with the host's budget: a kernel change
is timed against the shipped kernel in one process, bits checked, with no second tree.

Two other forms were timed with this bench and dropped: a rolling L2 prefetch during the
kernel (754bbcb: 0.82-0.996x, bench/decode-attention-roll-h200.json) and K and V through a
cp.async ring of shared memory (7ca89cb: 0.78-1.065x, bench/decode-attention-ring-h200.json,
with per-CTA phase clocks and a bare-read roofline).

The pool has the default model's layout (30 layers, 3 KV heads of 64, f32, 16-token pages
handed out shuffled) and random data; each case is one decode step of ``rows`` rows with
histories uniform in a range and launches attn_decode for layers 0..29 in turn, as a step
does (the layers' data differ, so nothing stays in L2 from one launch to the next). Every
configuration must give the same bits (a prefetch changes no arithmetic): checked per case.
Reported per case and configuration: us per layer (median of rounds, min-max) and the KV
bytes the launch reads over its time (TB/s); ratios against the first configuration are
paired within a round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

N_LAYERS, N_HEADS, N_KV, HEAD_DIM, PAGE = 30, 9, 3, 64, 16
CASES = (("1 row, history 4000", 1, (4000, 4000)),
         ("32 rows, 128-192", 32, (128, 192)),
         ("64 rows, 128-192", 64, (128, 192)),  # gpu_generate's batch-64 decode
         ("128 rows, 128-192", 128, (128, 192)),
         ("64 rows, 400-1200", 64, (400, 1200)),
         ("256 rows, 400-1200", 256, (400, 1200)),
         ("496 rows, 400-1200", 496, (400, 1200)),
         ("1024 rows, 100-900", 1024, (100, 900)),
         ("128 rows, 2000-4000", 128, (2000, 4000)),
         ("256 rows, 100-600", 256, (100, 600)))
FULL = 2**31 - 1
# name -> prefetch budget before the PDL wait: "budget" for the host's, or positions
CONFIGS: dict[str, int | str] = {"budget": "budget", "full": FULL, "none": 0,
                                 "alt": "alt",  # alt: --alt-source's kernel, the budget
                                 "g1": "g1"}  # the shipped kernel at one head a CTA
DEFAULT_CONFIGS = "budget,full,none"


def build(cp: Any, rows: int, hist: tuple[int, int], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(hist[0], hist[1] + 1, rows)  # positions 0..len-1; the row is len-1
    pages = -(-lens // PAGE)
    perm = rng.permutation(int(pages.sum())).astype(np.int32)
    width = int(pages.max())
    tables = np.zeros((rows, width), np.int32)
    at = 0
    for i, n in enumerate(pages):
        tables[i, :n] = perm[at:at + n]
        at += n
    segs = np.stack([np.arange(rows), np.ones(rows), lens - 1, np.arange(rows)],
                    axis=1).astype(np.int32)
    shape = (int(pages.sum()), N_LAYERS, PAGE, N_KV * HEAD_DIM)
    gen = cp.random.default_rng(seed)
    k = gen.standard_normal(size=shape, dtype=cp.float32)
    v = gen.standard_normal(size=shape, dtype=cp.float32)
    q = gen.standard_normal(size=(rows, N_HEADS * HEAD_DIM), dtype=cp.float32)
    return {"q": q, "k": k, "v": v, "segs": cp.asarray(segs), "tables": cp.asarray(tables),
            "bytes": int(lens.sum()) * N_KV * HEAD_DIM * 4 * 2,
            "cap": -(-int(lens.max()) // 256) * 256}


ALT: dict[str, Any] = {}  # "module": the --alt-source module, compiled once


def alt_kernel(cp: Any, source: str, g: int) -> Any:
    """attn_decode<g, 0> of another attention_decode.cu (ALT's module)."""
    from crucible.kernels.loader import DECODE_GROUPS
    from crucible.kernels.source import cuda_source_dir

    if "module" not in ALT:
        with open(source) as f:
            code = f.read()
        ALT["module"] = cp.RawModule(code=code, options=("-std=c++17", f"-I{cuda_source_dir()}"),
                                     name_expressions=[f"attn_decode<{h}, 0>"
                                                       for h in DECODE_GROUPS])
    return ALT["module"].get_function(f"attn_decode<{g}, 0>")


def launcher(cp: Any, d: dict[str, Any], alt_source: str | None = None) -> Any:
    from crucible.kernels.attention import decode_args, decode_prefetch_len
    from crucible.kernels.launch import launch
    from crucible.kernels.loader import (decode_kernel, ensure_dynamic_smem, sm_count,
                                         smem_optin_limit)
    from crucible.kernels.variants import decode_smem_bytes, parse_variant, plan_launch

    rows = int(d["segs"].shape[0])
    plan = plan_launch(parse_variant("exact-q4-k64"), n_heads=N_HEADS, n_kv_heads=N_KV,
                       head_dim=HEAD_DIM, capacity=d["cap"], smem_limit=smem_optin_limit(),
                       decode=True, rows=rows, sm_count=sm_count())
    g = plan.decode_heads
    fns = {"shipped": decode_kernel(g)}
    if alt_source is not None:
        fns["alt"] = alt_kernel(cp, alt_source, g)
    for fn in fns.values():
        ensure_dynamic_smem(fn, plan.smem_bytes)
    fns["g1"] = decode_kernel(1)
    smem1 = decode_smem_bytes(d["cap"], 1)
    ensure_dynamic_smem(fns["g1"], smem1)
    out = cp.empty_like(d["q"])
    budget = decode_prefetch_len(N_HEADS // g * rows, N_HEADS // N_KV // g)
    budget1 = decode_prefetch_len(N_HEADS * rows, N_HEADS // N_KV)

    def run(config: str, layer: int) -> Any:
        prefetch = CONFIGS[config]
        if config == "g1":
            args = decode_args(d["q"], d["k"], d["v"], layer, d["segs"], d["tables"], out,
                               N_HEADS, N_KV, d["cap"], heads_per_cta=1, prefetch_len=budget1)
            launch(fns["g1"], (N_HEADS, rows, 1), (256, 1, 1), args, shared_mem=smem1)
            return out
        args = decode_args(d["q"], d["k"], d["v"], layer, d["segs"], d["tables"], out, N_HEADS,
                           N_KV, d["cap"], heads_per_cta=g,
                           prefetch_len=budget if prefetch in ("budget", "alt") else int(prefetch))
        launch(fns["alt" if config == "alt" else "shipped"], (N_HEADS // g, rows, 1),
               (256, 1, 1), args, shared_mem=plan.smem_bytes)
        return out

    return run, budget, g


def time_layers(cp: Any, run: Any, config: str) -> float:
    """us per layer over one pass of the 30 layers (events around the pass)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for layer in range(N_LAYERS):
        run(config, layer)
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / N_LAYERS


def main(argv: list[str] | None = None) -> int:
    import cupy as cp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma list of {', '.join(CONFIGS)}; ratios are against the first")
    p.add_argument("--cases", default=None,
                   help="case names separated by ';' (default: all)")
    p.add_argument("--alt-source", default=None,
                   help="another attention_decode.cu, timed as configuration 'alt'")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    if ("alt" in configs) != (args.alt_source is not None):
        p.error("configuration 'alt' and --alt-source go together")
    cases = [c for c in CASES if args.cases is None or c[0] in args.cases.split(";")]
    if not cases:
        p.error(f"no case named in {args.cases!r}; known: {'; '.join(c[0] for c in CASES)}")
    result: dict[str, Any] = {"command": "python3 " + " ".join(sys.argv), "cases": {},
                              "configs": {c: CONFIGS[c] for c in configs},
                              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    base = configs[0]
    for ci, (name, rows, hist) in enumerate(cases):
        d = build(cp, rows, hist, seed=ci)
        run, budget, g = launcher(cp, d, args.alt_source)
        ref = run(base, 7).copy()
        same = all(bool((run(c, 7).view(cp.uint32) == ref.view(cp.uint32)).all())
                   for c in configs)
        for c in configs:  # warm-up
            time_layers(cp, run, c)
        times: dict[str, list[float]] = {c: [] for c in configs}
        for r in range(args.rounds):
            for c in (configs if r % 2 == 0 else configs[::-1]):
                times[c].append(time_layers(cp, run, c))
        case: dict[str, Any] = {"rows": rows, "history": hist, "heads_per_cta": g,
                                "budget_positions": budget, "bits_identical": same,
                                "kv_bytes_per_layer": d["bytes"]}
        for c, ts in times.items():
            med = statistics.median(ts)
            case[c] = {"us_per_layer": {"median": round(med, 2), "min": round(min(ts), 2),
                                        "max": round(max(ts), 2)},
                       "tb_per_s": round(d["bytes"] / med / 1e6, 3)}
        for c in configs[1:]:
            ratios = [a / b for a, b in zip(times[base], times[c])]
            case[f"{base}_over_{c}"] = {"median": round(statistics.median(ratios), 3),
                                        "min": round(min(ratios), 3),
                                        "max": round(max(ratios), 3)}
        result["cases"][name] = case
        print(f"{name:22s} G={g} budget={budget:6d} bits {'same' if same else 'DIFFER'}", flush=True)
        for c in configs:
            speed = "" if c == base else f"  x{case[f'{base}_over_{c}']['median']:.3f}"
            print(f"    {c:10s} {case[c]['us_per_layer']['median']:8.1f} us "
                  f"{case[c]['tb_per_s']:5.2f} TB/s{speed}", flush=True)
        del d, run
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(c["bits_identical"] for c in result["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
