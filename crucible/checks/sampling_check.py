"""``llm-engine gpu-sampling``: the device sampler against the host sampler, with counts.

Sections (each prints its counts; any failure exits 1):
  rng        device SplitMix64 bits and uniforms == rng.random_bits / rng.uniform for
             100,000+ (seed, n) pairs, negative and beyond-64-bit seeds included;
  greedy     temperature 0 == host argmax (exact ties, -0.0 vs +0.0, -inf, penalties, masks);
  matrix     tokens == host ``sample_row`` over temperature 0.3/0.8/1.0/1.7 x top_k
             None/1/5/40/128/500 x top_p 0.5/0.9/1.0 x min_p 0/0.05 x penalties x min_tokens
             masking, on random, peaked, tied and tied-maximum logits; top-N logprobs equal
             in ids and within 1e-9; the whole matrix run twice is identical bitwise;
  paths      top_k beyond the shared-memory prefix (2047..V-1), top_p/min_p-only rows whose
             answer needs the full-row sort, and vocabularies 1000 / 2049 / 262144;
  narrow     flat rows with nothing truncated whose draw lies past the first 256: the
             crossing located by narrowing the key range (and tied ones' fallback);
  batch      a needle row alone == inside batches of 1..64 (and 140, 300: blocks that
             sample several rows) at random positions, ids and logprob bits;
  chi2       draws over 20,000+ seeds vs a known small distribution (fails below p = 1e-4),
             and a negative control: other seeds must change the draws;
  engine     a tiny model's engine sampling on the device == sampling on the host;
  timing     microseconds per sampled step, 1 and 64 rows (printed, not judged).
A token mismatch is allowed (and reported) only where the host's own decision lies within
1e-9 of its threshold and the weights are not exact (the contract in cupy_sampling.py).
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from crucible.engine.rng import random_bits, uniform
from crucible.checks.batch_check import Counts
from crucible.checks.sampling_cases import (KINDS, Case, boundary_margin, case, make_logits,
                                         matrix_cases)
from crucible.arg_types import positive_int


@dataclass
class Harness:
    sampler: Any  # sample(logits, rows) -> SampleOutput
    to_device: Callable[[np.ndarray], Any]
    draws: Callable[[Sequence[int], Sequence[int]], tuple[np.ndarray, np.ndarray]]
    on_gpu: bool
    boundary: int = 0  # mismatches the contract allows (reported)
    routes: Counter = field(default_factory=Counter)  # rows per device route, this section

    def note_routes(self) -> None:
        last = getattr(self.sampler, "last_paths", None)
        if last is not None:
            self.routes.update(int(f) for f in last())

    def take_routes(self) -> str:
        """Rows per route since the last call, e.g. 'routes: 40 sorted, 3 sequential'."""
        names = ((1, "full-row sort"), (16, "2048-prefix"), (32, "narrowed"),
                 (2, "sequential decision"), (4, "top_k > 2048"), (8, "greedy on f32"))
        total = sum(self.routes.values())
        parts = [f"{sum(n for f, n in self.routes.items() if f & bit)} {name}"
                 for bit, name in names]
        self.routes.clear()
        return f"; routes of {total} rows: " + ", ".join(parts) if total else ""


def cupy_harness() -> Harness:
    import cupy as cp

    from crucible.backend.cupy_sampling import CupySampler, device_draws

    return Harness(CupySampler(), cp.asarray, device_draws, True)


def lp_bits(lp: dict[int, float] | None) -> tuple | None:
    return None if lp is None else tuple((k, struct.pack("<d", v)) for k, v in lp.items())


def run_cases(h: Harness, cases: Sequence[Case], logits: np.ndarray, batch: int) -> list:
    dev = h.to_device(logits)
    vocab = logits.shape[1]
    out = []
    for i in range(0, len(cases), batch):
        got = h.sampler.sample(dev, [c.sampling(vocab) for c in cases[i : i + batch]])
        h.note_routes()
        out += list(zip(got.token_ids, got.logprobs))
    return out


def compare(h: Harness, c: Counts, cases: Sequence[Case], logits: np.ndarray,
            got: list) -> None:
    for cs, (token, lp) in zip(cases, got):
        want = cs.host(logits)
        if token != want.token_id:
            margin, exact = boundary_margin(logits[cs.row], cs)
            if margin < 1e-9 and not exact:
                h.boundary += 1
                print(f"boundary (allowed): {cs.label}: device {token}, host {want.token_id}, "
                      f"host margin {margin:.1e}")
                continue
            c.check(False, f"{cs.label}: device token {token}, host {want.token_id} "
                           f"(host margin {margin:.1e})")
            continue
        c.check(True, "")
        if cs.params.logprobs is None:
            c.check(lp is None, f"{cs.label}: logprobs not asked for, got {lp}")
            continue
        ok = lp is not None and list(lp) == list(want.logprobs)
        err = max((abs(lp[k] - want.logprobs[k]) for k in want.logprobs), default=0.0) if ok \
            else float("inf")
        c.check(ok and err <= 1e-9, f"{cs.label}: logprobs {lp} vs host {want.logprobs} "
                                    f"(max diff {err:.1e})")


def check_rng(h: Harness, c: Counts, rng: np.random.Generator, pairs: int) -> None:
    special = [0, 1, -1, 2**63, -(2**63), 2**64 - 1, 2**64, 2**64 + 12345, -(2**70) + 3,
               2**100 + 7]
    seeds = special * 8 + [int(v) for v in rng.integers(0, 2**63, pairs // 3)]
    seeds += [-int(v) for v in rng.integers(1, 2**63, pairs // 3)]
    seeds += [int(v) * 2**20 + 7 for v in rng.integers(0, 2**62, pairs - len(seeds))]
    ns = [0, 1, 2, 2**31, 2**32 + 1, 2**40, 2**62 - 1] * 12
    ns += [int(v) for v in rng.integers(0, 2**40, len(seeds) - len(ns))]
    ns[len(special) * 8 : len(special) * 8 + 5000] = range(5000)  # a counter stream too
    bits, uni = h.draws(seeds, ns)
    bad = [i for i, (s, n) in enumerate(zip(seeds, ns))
           if int(bits[i]) != random_bits(s, n) or float(uni[i]) != uniform(s, n)]
    for i in bad[:5]:
        print(f"FAIL rng seed {seeds[i]} n {ns[i]}: device {int(bits[i]):#x} {uni[i]!r}, "
              f"host {random_bits(seeds[i], ns[i]):#x} {uniform(seeds[i], ns[i])!r}")
    c.passed += len(seeds) - len(bad)
    c.failed += len(bad)
    print(f"rng: {len(seeds) - len(bad)} of {len(seeds)} (seed, n) pairs bit-identical")


def greedy_logits(vocab: int, rng: np.random.Generator) -> np.ndarray:
    rows = make_logits("tied", 6, vocab, rng)
    rows[0] = 0.0  # all tied: token 0
    rows[1] = -1.0
    rows[1, [3, 7]] = [-0.0, 0.0]  # -0.0 ties +0.0: the lower id wins
    rows[2, -1] = 100.0  # the maximum at the last id
    rows[3, ::2] = -np.inf
    return rows


def check_greedy(h: Harness, c: Counts, rng: np.random.Generator, vocab: int) -> None:
    logits = greedy_logits(vocab, rng)
    cases = [case(f"greedy row {r} pen={int(p)} mask={int(m)} lp={lp}", r, logits, rng,
                  penalties=p, mask=m, temperature=0.0, logprobs=lp)
             for r in range(logits.shape[0]) for p in (False, True) for m in (False, True)
             for lp in (None, 3)]
    before = c.result()
    compare(h, c, cases, logits, run_cases(h, cases, logits, 64))
    print(f"greedy: {c.passed - before[0]} passed, {c.failed - before[1]} failed "
          f"({len(cases)} rows{h.take_routes()})")


def check_matrix(h: Harness, c: Counts, rng: np.random.Generator, vocab: int, batch: int,
                 quick: bool) -> None:
    for kind in KINDS:
        logits = make_logits(kind, 8, vocab, rng)
        cases = matrix_cases(kind, logits, rng, quick)
        before = c.result()
        got = run_cases(h, cases, logits, batch)
        compare(h, c, cases, logits, got)
        again = run_cases(h, cases, logits, batch)
        same = [a[0] == b[0] and lp_bits(a[1]) == lp_bits(b[1]) for a, b in zip(got, again)]
        c.check(all(same), f"matrix {kind}: a repeat run differs in {same.count(False)} rows")
        print(f"matrix {kind}: {c.passed - before[0]} passed, {c.failed - before[1]} failed "
              f"({len(cases)} rows, run twice{h.take_routes()})")


def check_paths(h: Harness, c: Counts, rng: np.random.Generator, vocab: int,
                quick: bool) -> None:
    before = c.result()
    for v in ([vocab, 1000, 2049] if quick else [vocab, 1000, 2049, 262144]):
        tops = sorted({k for k in (2047, 2048, 2049, 5000, v - 1) if 1 <= k < v}) + [None]
        for kind in ("random", "peaked", "tied"):
            logits = make_logits(kind, 2, v, rng)
            grid = [(k, p, m, t) for k in tops for p in (0.5, 0.99, 1.0) for m in (0.0, 0.001)
                    for t in (0.7, 1.7)]
            if v > 100_000 or quick:
                grid = grid[:: 5]
            cases = [case(f"paths V={v} {kind} top_k={k} top_p={p} min_p={m} T={t}", i % 2,
                          logits, rng, temperature=t, top_k=k, top_p=p, min_p=m,
                          logprobs=(None, 2)[i % 2]) for i, (k, p, m, t) in enumerate(grid)]
            compare(h, c, cases, logits, run_cases(h, cases, logits, 64))
    print(f"paths: {c.passed - before[0]} passed, {c.failed - before[1]} failed"
          f"{h.take_routes()}")


def check_narrow(h: Harness, c: Counts, rng: np.random.Generator, vocab: int,
                 quick: bool, per_point: int | None = None) -> None:
    """Untruncated rows (flat logits, T 0.7-1.7, top_k > 2048 or off, min_p keeping all)
    whose draw lands past the first 256: narrowed (route 32), or sorted when tied; on the
    GPU some rows must have been decided by narrowing, so the route is tested."""
    before = c.result()
    grid = [(t, k, m) for t in (0.7, 1.0, 1.7) for k in (None, 3000) for m in (0.0, 1e-200)]
    for kind in ("random", "tied"):
        logits = make_logits(kind, 4, vocab, rng)
        cases = [case(f"narrow {kind} T={t} top_k={k} min_p={m} #{i}", i % 4, logits, rng,
                      temperature=t, top_k=k, min_p=m)
                 for t, k, m in grid for i in range(per_point or (4 if quick else 60))]
        compare(h, c, cases, logits, run_cases(h, cases, logits, 64))
    decided = sum(n for f, n in h.routes.items() if f & 32 and not f & 1)
    if getattr(h.sampler, "last_paths", None) is not None:  # a sampler that reports routes
        c.check(decided > 0, "narrow: no row was decided by narrowing")
    print(f"narrow: {c.passed - before[0]} passed, {c.failed - before[1]} failed, {decided} "
          f"decided by narrowing{h.take_routes()}")


def check_batch(h: Harness, c: Counts, rng: np.random.Generator, vocab: int,
                sizes: Sequence[int]) -> None:
    pool = np.concatenate([make_logits(k, 2, vocab, rng) for k in KINDS])
    needles = [case("greedy", 4, pool, rng, temperature=0.0, logprobs=5),
               case("top-k/top-p", 0, pool, rng, penalties=True, temperature=0.8, top_k=40,
                    top_p=0.9, logprobs=3),
               case("default T=1", 1, pool, rng, temperature=1.0),
               case("top_p only, ties", 5, pool, rng, temperature=1.0, top_p=0.5, logprobs=0),
               case("top_k 3000", 2, pool, rng, mask=True, temperature=1.2, top_k=3000),
               case("min_p", 3, pool, rng, temperature=0.9, min_p=0.05, logprobs=20)]
    others = [case(f"other {i}", i % pool.shape[0], pool, rng, penalties=i % 5 == 0,
                   temperature=(0.0, 0.7, 1.0)[i % 3], top_k=(None, 20, 100, 4000)[i % 4],
                   top_p=(1.0, 0.8)[i % 2], logprobs=(None, 2, None)[i % 3]) for i in range(300)]
    before = c.result()
    for nd in needles:
        alone = h.sampler.sample(h.to_device(pool[nd.row : nd.row + 1]),
                                 [nd.sampling(vocab, row=0)])
        want = (alone.token_ids[0], lp_bits(alone.logprobs[0]))
        for size in sizes:
            at = int(rng.integers(size))
            rows = [others[int(i)] for i in rng.choice(len(others), size - 1)]
            perm = rng.permutation(pool.shape[0])  # the needle's logits move too
            logits = pool[perm]
            where = {int(r): i for i, r in enumerate(perm)}
            batch = [o.sampling(vocab, row=where[o.row]) for o in rows]
            batch.insert(at, nd.sampling(vocab, row=where[nd.row]))
            got = h.sampler.sample(h.to_device(logits), batch)
            c.check((got.token_ids[at], lp_bits(got.logprobs[at])) == want,
                    f"batch: needle '{nd.label}' at {at} of {size} differs from alone")
    print(f"batch: {c.passed - before[0]} passed, {c.failed - before[1]} failed "
          f"({len(needles)} needles x sizes {list(sizes)})")


def run(h: Harness, args: argparse.Namespace, make_runner: Callable[[bool], Any] | None) -> int:
    from crucible.checks.sampling_stats import check_chi2, check_engine, time_sampler

    rng = np.random.default_rng(args.seed)
    c = Counts()
    t0 = time.time()
    q = args.quick
    check_rng(h, c, rng, 2000 if q else 100_000)
    check_greedy(h, c, rng, args.vocab)
    check_matrix(h, c, rng, args.vocab, args.rows, q)
    check_paths(h, c, rng, args.vocab, q)
    check_narrow(h, c, rng, args.vocab, q)
    sizes = [1, 2, 17, 64] if q else [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 63,
                                      64, 140, 300]
    check_batch(h, c, rng, args.vocab, sizes)
    check_chi2(h, c, rng, 2000 if q else 24_000)
    if make_runner is not None:
        check_engine(c, make_runner, rng)
    if h.on_gpu and not q:
        time_sampler(h, rng, args.vocab)
    passed, failed = c.result()
    print(f"gpu-sampling: {passed} passed, {failed} failed, {h.boundary} boundary mismatches "
          f"allowed ({time.time() - t0:.1f} s)")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-sampling")
    p.add_argument("--rows", type=positive_int, default=64, help="rows per sampling call in the matrix")
    p.add_argument("--vocab", type=positive_int, default=49152, help="vocabulary of the test logits")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a small subset (harness check)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.vocab < 64:
        p.error("--rows must be >= 1 and --vocab >= 64")
    from crucible.backend.select import gpu_available

    if not gpu_available():
        print("gpu-sampling: needs CuPy and a CUDA GPU", file=sys.stderr)
        return 2

    def make_runner(device_sampling: bool) -> Any:
        from crucible.engine.runner import ModelRunner
        from crucible.model.tiny import tiny_random_model

        # The CUDA attention needs head_dim 64: the default model's 9/3/64 geometry.
        model = tiny_random_model(seed=3, n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=192,
                                  ffn_size=256)
        return ModelRunner(model, num_pages=64, device="cuda", device_sampling=device_sampling)

    return run(cupy_harness(), args, make_runner)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
