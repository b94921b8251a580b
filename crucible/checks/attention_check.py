"""``llm-engine gpu-prefill-attention-check``: every variant against the reference.

For each fixed and fuzz case the reference runs once on the canonical batch; every selected
variant then runs on the canonical batch and on rebuilt views of it (pages remapped,
segments reversed, each segment alone, future positions poisoned). Exact variants and the
reference itself must reproduce the canonical reference bits (uint32 views) in every view;
online variants must stay within 2e-5 + 2e-5*|ref|. A float64 oracle checks sampled rows of
every variant. Prints resources, counts and a per-variant table; exit status 1 on any
failure. Usage: ``[--fuzz N] [--seed S] [--variants NAME ...] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from crucible.checks.attention_cases import (
    LAYER, Case, HostBatch, build, remap_pages, reverse_segments, single_segment,
    truncate_and_poison)
from crucible.checks.attention_suite import fixed_cases, fuzz_cases
from crucible.checks.oracle import oracle_rows
from crucible.kernels.variants import Variant, all_variants, parse_variant
from crucible.arg_types import non_negative_int, positive_int

ONLINE_ATOL = ONLINE_RTOL = 2e-5
ORACLE_ATOL = ORACLE_RTOL = 1e-4


@dataclass
class Tally:
    """Per-variant counters (mutable: accumulated over the whole run)."""

    comparisons: int = 0
    elements: int = 0
    failures: int = 0
    invariance_checks: int = 0
    poison_checks: int = 0
    oracle_rows: int = 0
    oracle_failures: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    oracle_max_abs: float = 0.0
    handovers: list[str] = field(default_factory=list)


def to_device(b: HostBatch) -> dict[str, Any]:
    import cupy as cp  # noqa: PLC0415

    return {"q": cp.asarray(b.q), "k": cp.asarray(b.k_pool), "v": cp.asarray(b.v_pool),
            "segs": cp.asarray(b.segments), "tables": cp.asarray(b.page_tables),
            "rows": cp.asarray(b.rows), "host": b}


def run_variant(variant: Variant, d: dict[str, Any]) -> tuple[Any, Any]:
    import cupy as cp  # noqa: PLC0415

    from crucible.kernels.attention import paged_attention  # noqa: PLC0415

    b: HostBatch = d["host"]
    out = cp.full(d["q"].shape, cp.nan, dtype=cp.float32)  # unwritten outputs stay NaN
    plan = paged_attention(d["q"], d["k"], d["v"], LAYER, d["segs"], d["tables"], out,
                           n_heads=b.case.n_heads, n_kv_heads=b.case.n_kv_heads,
                           max_chunk=b.max_chunk, score_capacity=b.capacity, variant=variant)
    return out, plan


def _compare(variant: Variant, out: Any, expected: Any, t: Tally, where: str) -> bool:
    import cupy as cp  # noqa: PLC0415

    t.comparisons += 1
    t.elements += int(out.size)
    err = cp.abs(out.astype(cp.float64) - expected.astype(cp.float64))
    finite = bool(cp.isfinite(err).all())
    if finite:
        t.max_abs = max(t.max_abs, float(err.max()))
        rel = err / cp.maximum(cp.abs(expected.astype(cp.float64)), 1e-30)
        t.max_rel = max(t.max_rel, float(rel.max()))
    if variant.is_exact:
        bad = out.view(cp.uint32) != expected.view(cp.uint32)
    else:
        bad = ~(err <= ONLINE_ATOL + ONLINE_RTOL * cp.abs(expected))
    n_bad = int(bad.sum())
    if n_bad:
        t.failures += 1
        idx = cp.argwhere(bad)[:4].get().tolist()
        got, want = out.get(), expected.get()
        shown = ", ".join(f"[{r},{c}] {got[r, c]!r} vs ref {want[r, c]!r}" for r, c in idx)
        print(f"  MISMATCH {variant.name} {where}: {n_bad} elements, first: {shown}")
    return n_bad == 0


def _views(b: HostBatch) -> list[tuple[str, HostBatch]]:
    views = [("remap", remap_pages(b, b.case.seed + 1)), ("poison", truncate_and_poison(b))]
    if len(b.case.slices) > 1:
        views.append(("reversed", reverse_segments(b)))
        views += [(f"alone-{i}", single_segment(b, i)) for i in range(len(b.case.slices))]
    return views


def check_case(case: Case, variants: list[Variant], tallies: dict[str, Tally]) -> None:
    b = build(case)
    canonical = to_device(b)
    views = [(name, to_device(v)) for name, v in _views(b)]
    ref, _ = run_variant(Variant("reference"), canonical)
    rng = np.random.default_rng(case.seed)
    sample = sorted({0, b.q.shape[0] - 1, *rng.integers(0, b.q.shape[0], 3).tolist()})
    oracle = oracle_rows(b.q, b.k_pool, b.v_pool, LAYER, b.segments, b.page_tables, sample,
                         case.n_heads, case.n_kv_heads)
    for variant in variants:
        t = tallies[variant.name]
        out, plan = ref, None
        if variant.family != "reference":
            out, plan = run_variant(variant, canonical)
            _compare(variant, out, ref, t, f"{case.name}/canonical")
            if plan.reason and plan.reason not in t.handovers:
                t.handovers.append(plan.reason)
        got = out[np.asarray(sample)].get().astype(np.float64)
        err = np.abs(got - oracle)
        t.oracle_rows += len(sample)
        t.oracle_max_abs = max(t.oracle_max_abs, float(np.nan_to_num(err, nan=np.inf).max()))
        if not bool(np.all(err <= ORACLE_ATOL + ORACLE_RTOL * np.abs(oracle))):
            t.oracle_failures += 1
            print(f"  ORACLE {variant.name} {case.name}: max error {float(np.nanmax(err))!r}")
        for name, d in views:
            view_out, _ = run_variant(variant, d)
            _compare(variant, view_out, ref[d["rows"]], t, f"{case.name}/{name}")
            if name == "poison":
                t.poison_checks += 1
            else:
                t.invariance_checks += 1


def print_resources(variants: list[Variant]) -> list[dict[str, Any]]:
    from crucible.kernels.loader import kernel_resources, smem_optin_limit  # noqa: PLC0415
    from crucible.kernels.variants import reference_smem_bytes, tiled_smem_bytes  # noqa: PLC0415

    rows = []
    print(f"shared memory opt-in limit per CTA: {smem_optin_limit()} bytes")
    print(f"{'variant':<16} {'regs':>5} {'static':>7} {'local':>6} "
          f"{'dyn C=1024 G=4':>15} {'G=3':>7}")
    for v in variants:
        r = kernel_resources(v)
        dyn = [reference_smem_bytes(1024) if v.family == "reference"
               else tiled_smem_bytes(v, g, 1024) for g in (4, 3)]
        rows.append({**asdict(r), "dynamic_smem_c1024_g4": dyn[0], "dynamic_smem_c1024_g3": dyn[1]})
        print(f"{v.name:<16} {r.registers:>5} {r.static_smem:>7} {r.local_bytes:>6} "
              f"{dyn[0]:>15} {dyn[1]:>7}")
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-prefill-attention-check")
    p.add_argument("--fuzz", type=non_negative_int, default=0, help="random compositions after fixed cases")
    p.add_argument("--seed", type=int, default=20260908)
    p.add_argument("--variants", nargs="+", default=None, help="default: every variant")
    p.add_argument("--fixed-limit", type=non_negative_int, default=None, help="run only the first N fixed")
    p.add_argument("--max-end", type=positive_int, default=None,
                   help="skip cases whose longest history exceeds this (sanitizer runs)")
    p.add_argument("--json", type=str, default=None)
    args = p.parse_args(argv)
    try:
        import cupy  # noqa: F401, PLC0415
    except ImportError:
        print("gpu-prefill-attention-check needs CuPy and a CUDA GPU", file=sys.stderr)
        return 2
    variants = [parse_variant(n) for n in args.variants] if args.variants else list(all_variants())
    if all(v.family != "reference" for v in variants):
        variants.insert(0, Variant("reference"))
    resources = print_resources(variants)
    cases = fixed_cases()[: args.fixed_limit] + fuzz_cases(args.fuzz, args.seed)
    if args.max_end is not None:
        cases = [c for c in cases if max(s + n for s, n in c.slices) <= args.max_end]
    tallies = {v.name: Tally() for v in variants}
    started = time.perf_counter()
    for case in cases:
        check_case(case, variants, tallies)
    elapsed = time.perf_counter() - started
    failed = any(t.failures or t.oracle_failures for t in tallies.values())
    n_fuzz = sum(c.name.startswith("fuzz-") for c in cases)
    print(f"\n{len(cases)} cases ({len(cases) - n_fuzz} fixed, {n_fuzz} fuzz, seed "
          f"{args.seed}), {sum(t.comparisons for t in tallies.values())} comparisons, "
          f"{elapsed:.1f} s")
    print(f"{'variant':<16} {'cmp':>6} {'elements':>12} {'fail':>5} {'inv':>5} {'poison':>6} "
          f"{'oracle':>6} {'max|err|':>10} {'max rel':>10} {'oracle err':>10}")
    for name, t in tallies.items():
        print(f"{name:<16} {t.comparisons:>6} {t.elements:>12} {t.failures + t.oracle_failures:>5} "
              f"{t.invariance_checks:>5} {t.poison_checks:>6} {t.oracle_rows:>6} "
              f"{t.max_abs:>10.3g} {t.max_rel:>10.3g} {t.oracle_max_abs:>10.3g}"
              + (f"  handover: {'; '.join(t.handovers)}" if t.handovers else ""))
    print("RESULT:", "FAIL" if failed else "PASS")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seed": args.seed, "fuzz": n_fuzz, "cases": len(cases),
                       "seconds": elapsed, "passed": not failed, "resources": resources,
                       "variants": {n: asdict(t) for n, t in tallies.items()}}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
