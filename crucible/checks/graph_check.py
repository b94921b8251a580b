"""``gpu-graph-check`` and ``gpu-decode-prefill``: two more ways of computing the same rows.

gpu-graph-check   decode steps replayed from CUDA graphs (padded up to a bucket), and lone
                  prefills replayed from singleton prefill graphs, == the same steps run
                  eagerly, bitwise. Two runners (graphs on / graphs off) run the
                  same schedule: the live batch walks through sizes 1..512 across the bucket
                  edges (8/9, 15/16/17, ..., 63/64/65, 96/97, 128/129, 256/257,
                  384/385, 512) for ``--steps``
                  decode steps each; between steps requests finish (their budget is spent, or
                  one is cut off) and new ones join on the freed pages at once, their prefill in
                  a step of its own. On the GPU every decode step must also be a replay. Where
                  there are no graphs (the numpy backend, CRUCIBLE_DECODE_GRAPHS=0) it says so
                  and compares eager against eager: the harness and pool reuse still run.
                  Then mixed steps (running decodes and joiners' prompt chunks in one
                  forward: mixed graphs) against the same steps run eagerly: short
                  histories, steps past 512 rows (checks/mixed_large_check.py), and
                  histories past 1,024 positions (checks/mixed_long_check.py).
                  Then the pipelined engine against the plain one (checks/pipeline_check.py),
                  and an all-greedy pipelined engine (its ids from the decode graphs'
                  argmax) against an engine without graphs (ids from the sampler's kernel).
gpu-decode-prefill  teacher forcing: the logits of decode step t equal the prefill logits of
                  prompt + generated[:t], bitwise (the canonical order,
                  docs/numerics.md). Checked against one
                  prefill per request with every row wanted, and against a packed step of
                  prefills truncated at random t.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.checks.batch_check import Counts, Req, add_common, load, pages_for, report, run_step
from crucible.checks.mixed_large_check import check_mixed_large
from crucible.checks.mixed_long_check import check_mixed_long
from crucible.checks.pipeline_check import check_pipeline
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.arg_types import positive_int

GRAPH_SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 47, 48, 49, 63, 64,
               65, 96, 97, 129, 200, 257, 384, 385, 512, 17, 1)
PROMPT_LENGTHS = (1, 2, 5, 15, 16, 17, 31, 33, 64, 100)
NO_GRAPHS = "graphs: not available on this device, checked eager only"


def make_pair(model: object, device: str, num_pages: int,
              settings: Settings | None = None) -> tuple[ModelRunner, ModelRunner]:
    """(candidate, eager reference): one model, two pools, both built by ``settings`` (the
    entry point's: CRUCIBLE_MIXED_GRAPH_ROWS, CRUCIBLE_GEMM); the reference never replays."""
    settings = settings or Settings()
    cand = ModelRunner(model, num_pages=num_pages, device=device, settings=settings)
    ref = ModelRunner(model, num_pages=num_pages, device=device, settings=settings)
    if hasattr(ref.backend, "graphs"):
        ref.backend.graphs = ref.backend.prefill_graphs = ref.backend.mixed_graphs = None
    return cand, ref


def graphs_of(runner: ModelRunner) -> object | None:
    return getattr(runner.backend, "graphs", None)


def check_graphs(cand: ModelRunner, ref: ModelRunner, sizes: list[int], steps: int,
                 max_prompt: int, seed: int) -> tuple[int, int]:
    # The schedule comes from rng alone, never from tokens, so both runners see the same one.
    rng = np.random.default_rng(seed)
    vocab = cand.config.vocab_size
    graphs = graphs_of(cand)
    pre = getattr(cand.backend, "prefill_graphs", None)
    if pre is not None:  # every lone prefill captured on sight: replay == eager is the check
        pre.capture_after = 1
    c = Counts()
    free = rng.permutation(cand.num_pages).tolist()
    live: list[tuple[Req, Req, int]] = []  # candidate's, reference's, tokens to generate
    serial = finished = 0
    for size in sizes:
        for s in range(steps):
            cut = int(rng.integers(len(live))) if s == 1 and live else -1  # one leaves early
            done = [x for i, x in enumerate(live)
                    if i == cut or len(x[0].tokens) - x[0].prompt_len >= x[2]]
            while len(live) - len(done) > size:
                extra = [x for x in live if x not in done]
                done.append(extra[int(rng.integers(len(extra)))])
            finished += len(done)
            for x in done:
                live.remove(x)
                free.extend(x[0].pages)  # reused at once by the next joiner
            joiners = []
            while len(live) + len(joiners) < size:
                toks = rng.integers(0, vocab, int(rng.integers(1, max_prompt + 1))).tolist()
                pages = [free.pop() for _ in range(pages_for(len(toks)))]
                a, b = Req(f"q{serial}", list(toks), pages), Req(f"q{serial}", list(toks), pages)
                joiners.append((a, b, int(rng.integers(1, 3 * steps + 2))))
                serial += 1
            if joiners:
                run_step(cand, [x[0] for x in joiners])
                run_step(ref, [x[1] for x in joiners])
                for a, b, _ in joiners:
                    c.compare(f"size {size} step {s}: join prefill {a.rid}", a.logits[-1],
                              b.logits[-1])
                live += joiners
            order = [live[i] for i in rng.permutation(len(live))]
            for a, _, _ in order:
                while len(a.pages) * 16 < len(a.tokens):
                    a.pages.append(free.pop())  # one list shared by both runners' Req
            before = graphs.num_replays if graphs is not None else 0
            run_step(cand, [x[0] for x in order])
            run_step(ref, [x[1] for x in order])
            if graphs is not None:
                c.check(graphs.num_replays == before + 1, f"size {size} step {s}: not replayed")
            for a, b, _ in order:
                c.compare(f"size {size} step {s}: decode {a.rid} at {a.done - 1}",
                          a.logits[-1], b.logits[-1])
    print(f"schedule: {serial} requests joined, {finished} finished between steps")
    pre = getattr(cand.backend, "prefill_graphs", None)
    if pre is not None:  # a lone joiner's prefill is a singleton prefill: a graph replay
        print(f"prefill graphs: {pre.num_captures} captured, {pre.num_replays} replays")
        c.check(pre.num_replays > 0, "no singleton prefill was replayed from a graph")
    return c.result()


def check_mixed(cand: ModelRunner, ref: ModelRunner, steps: int, max_prompt: int,
                seed: int) -> tuple[int, int]:
    """Mixed steps (running decodes + 1-3 joiners' prompt chunks in one forward) on the
    candidate (mixed graphs: padded replays) == the eager reference, every logits row
    bitwise; on the GPU every qualifying step must be a replay."""
    from crucible.backend.cupy_mixed_graphs import MAX_SLICES, MAX_TOKENS

    rng = np.random.default_rng(seed + 7)
    vocab, mixed = cand.config.vocab_size, getattr(cand.backend, "mixed_graphs", None)
    if mixed is not None:  # every shape captured at once, none turned away: all replay
        mixed.capture_after, mixed.max_graphs = 1, 10**6
    c = Counts()
    free = rng.permutation(cand.num_pages).tolist()
    live: list[tuple[Req, Req, int]] = []  # candidate's, reference's, tokens to generate
    serial = replays = 0
    for s in range(steps):
        for x in [x for x in live if len(x[0].tokens) - x[0].prompt_len >= x[2]]:
            live.remove(x)
            free.extend(x[0].pages)
        for _ in range(int(rng.integers(1, 4)) if len(live) < 40 else 0):
            toks = rng.integers(0, vocab, int(rng.integers(2, max_prompt + 1))).tolist()
            budget = int(rng.integers(1, 12))
            need = pages_for(len(toks) + budget + 1)  # every page it will ever hold, now
            if need > len(free):
                break  # a small pool (the quick check): join when pages come back
            pages = [free.pop() for _ in range(need)]
            a, b = Req(f"m{serial}", list(toks), pages), Req(f"m{serial}", list(toks), pages)
            live.append((a, b, budget))
            serial += 1
        if not live:
            continue
        chunk = int(rng.integers(2, max_prompt + 1))
        fed = [min(chunk, len(a.tokens) - a.done) for a, _, _ in live]
        # (A lone prompt is a singleton prefill: the prefill graphs take it first.)
        qualifies = (len(fed) > 1 and sum(fed) <= (MAX_TOKENS if mixed is None
                                                     else mixed.max_tokens)
                     and 0 < sum(n > 1 for n in fed) <= MAX_SLICES)
        before = mixed.num_replays if mixed is not None else 0
        run_step(cand, [x[0] for x in live], chunk=chunk)
        run_step(ref, [x[1] for x in live], chunk=chunk)
        if mixed is not None and qualifies:
            replays += 1
            c.check(mixed.num_replays == before + 1, f"mixed step {s}: not replayed")
        for a, b, _ in live:
            c.compare(f"mixed step {s}: {a.rid} at {a.done}", a.logits[-1], b.logits[-1])
    if mixed is not None:
        print(f"mixed graphs: {mixed.num_captures} captured, {mixed.num_replays} replays "
              f"({replays} qualifying steps of {steps})")
        c.check(replays > 0, "no mixed step qualified for a graph")
    return c.result()


def check_decode_prefill(runner: ModelRunner, lengths: list[int], steps: int,
                         seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    vocab, ctx = runner.config.vocab_size, runner.config.max_context
    lengths = [min(n, ctx - steps - 1) for n in lengths]
    free = rng.permutation(runner.num_pages).tolist()
    take = lambda n: [free.pop() for _ in range(pages_for(n))]  # noqa: E731
    reqs = [Req(f"r{i}", rng.integers(0, vocab, n).tolist(), take(n + steps))
            for i, n in enumerate(lengths)]
    run_step(runner, reqs)  # packed prefill: logits of step 0
    for _ in range(steps):  # decode steps (graph replays on the GPU)
        run_step(runner, reqs)
    c = Counts()
    for r in reqs:  # alone: one prefill of prompt + generated[:steps], every row from prompt-1
        toks, first = r.tokens[: r.prompt_len + steps], r.prompt_len - 1
        out = runner.forward(build_packed_batch([SegmentSpec(
            "tf", toks, 0, take(len(toks)), list(range(first, len(toks))))]))
        for t in range(steps + 1):
            c.compare(f"{r.rid} (prompt {r.prompt_len}) decode step {t} vs prefill",
                      r.logits[t][-1], out[t])
    # Packed, truncated at a random t per request, in reverse order: t's last row only.
    cut = [int(rng.integers(0, steps + 1)) for _ in reqs]
    specs = [SegmentSpec(r.rid, r.tokens[: r.prompt_len + t], 0, take(r.prompt_len + t),
                         [r.prompt_len + t - 1]) for r, t in zip(reqs, cut)][::-1]
    out = runner.forward(build_packed_batch(specs))[::-1]
    for r, t, row in zip(reqs, cut, out):
        c.compare(f"{r.rid} decode step {t} vs packed prefill of prompt + generated[:{t}]",
                  r.logits[t][-1], row)
    return c.result()


def graph_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-graph-check")
    add_common(p, steps=3)
    p.add_argument("--sizes", type=positive_int, nargs="+", default=list(GRAPH_SIZES),
                   help="live batch sizes in order (at most 512: the largest bucket)")
    args = p.parse_args(argv)
    t0 = time.time()
    model = load(args)
    max_prompt = min(args.max_prompt, model.config.max_context - 3 * args.steps - 3)
    per_req = pages_for(max_prompt + 3 * args.steps + 2)
    settings = Settings.from_env()
    rows = settings.mixed_graph_rows
    cand, ref = make_pair(model, args.device, max(args.sizes) * per_req + 16, settings)
    graphs = graphs_of(cand)
    if graphs is None:
        print(NO_GRAPHS)
    passed, failed = check_graphs(cand, ref, args.sizes, args.steps, max_prompt, args.seed)
    more = check_mixed(cand, ref, 12 * args.steps, max_prompt, args.seed)
    passed, failed = passed + more[0], failed + more[1]
    more = check_mixed_large(cand, ref, 2 * args.steps, args.seed, rows)
    passed, failed = passed + more[0], failed + more[1]
    more = check_mixed_long(model, args.device, settings, 2 * args.steps, args.seed, make_pair)
    passed, failed = passed + more[0], failed + more[1]
    if graphs is not None:
        print(f"graphs: {graphs.num_captures} captures, {graphs.num_replays} replays")
    for greedy, mixed in ((False, None), (True, None), (False, "graphs"), (False, "eager")):
        same, diff, chained = check_pipeline(model, args.device, args.seed, greedy=greedy,
                                             mixed=mixed)
        if graphs is not None and chained == 0:
            diff += 1  # pipelining is on by default with decode graphs: it must have run
        what = ("all-greedy pipelined engine vs an engine without graphs" if greedy
                else f"pipelined engine, mixed steps fed ({mixed}), vs plain engine" if mixed
                else "pipelined engine vs plain engine")
        print(f"{what}: {same} requests identical, {diff} failures, "
              f"{chained} steps queued before the previous step's ids were read")
        passed, failed = passed + same, failed + diff
    print(f"{'graph replay' if graphs is not None else 'eager'} vs eager, sizes {args.sizes}, "
          f"{args.steps} decode steps each, requests finishing and joining")
    return report("gpu-graph-check", cand, args, passed, failed, t0)


def decode_prefill_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-decode-prefill")
    add_common(p, steps=8)
    p.add_argument("--lengths", type=positive_int, nargs="+", default=list(PROMPT_LENGTHS))
    args = p.parse_args(argv)
    t0 = time.time()
    model = load(args)
    n_pages = 3 * sum(pages_for(n + args.steps) for n in args.lengths) + 4
    runner = ModelRunner(model, num_pages=n_pages, device=args.device)
    passed, failed = check_decode_prefill(runner, args.lengths, args.steps, args.seed)
    print(f"decode step t vs prefill of prompt + generated[:t], prompts {args.lengths}, "
          f"{args.steps} decode steps")
    return report("gpu-decode-prefill", runner, args, passed, failed, t0)


if __name__ == "__main__":
    sys.exit(graph_main(sys.argv[1:]))
