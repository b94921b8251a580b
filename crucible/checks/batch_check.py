"""``gpu-batch`` and ``gpu-paged``: a request's logits must not depend on its company or its pages.

The numerics contract (docs/numerics.md) promises that every output element is computed in a
canonical order, whatever the batch holds and wherever the K/V pages live. These commands check the promise
on whole forwards (prefill then decode steps), comparing f32 logits *bitwise*:

  gpu-batch  a needle request (prefill, then ``--steps`` decode steps) run alone == the same
             needle inside batches of 1..64 requests at a random row position (reshuffled every
             step), including the decode-graph bucket edges 15/16/17, 31/32/33, 63/64. Its
             prefill shares a mixed step with other prefills and with decode rows.
  gpu-paged  the same requests on contiguous pages == on interleaved pages (adjacent physical
             pages owned by different requests), reversed tables, a random permutation and
             strided pages. One pool serves every layout in turn, so the pages also hold the
             previous layout's stale K/V: a read past a request's own history would show.

The small driver here (``Req``, ``run_step``) is shared with ``graph_check``. Everything runs on
any device; ``--device cpu`` exercises the harness on the numpy backend.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.arg_types import int_in, positive_int

BATCH_SIZES = (1, 2, 3, 5, 8, 15, 16, 17, 24, 31, 32, 33, 47, 48, 49, 63, 64)


class Counts:
    """Passed/failed comparisons; the first few failures are printed with their worst diff."""

    def __init__(self) -> None:
        self.passed = self.failed = 0

    def compare(self, label: str, got: np.ndarray, want: np.ndarray) -> bool:
        ok = bits_equal(got, want)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            if self.failed <= 10:
                print(f"FAIL {label}: {describe_diff(got, want)}", flush=True)
        return ok

    def check(self, ok: bool, label: str) -> None:
        self.passed += ok
        self.failed += not ok
        if not ok and self.failed <= 10:
            print(f"FAIL {label}", flush=True)

    def result(self) -> tuple[int, int]:
        return self.passed, self.failed


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and the same f32 bit patterns (so -0.0 != 0.0 and equal NaNs match)."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def describe_diff(a: np.ndarray, b: np.ndarray) -> str:
    if np.shape(a) != np.shape(b):
        return f"shape {np.shape(a)} vs {np.shape(b)}"
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return f"{int((d > 0).sum())} elements differ, max |diff| {np.nanmax(d):.3g}"


@dataclass(eq=False)  # identity: the checks keep Req objects in lists
class Req:
    """A request as the checks drive it: tokens so far, how many have K/V in the pool."""

    rid: str
    tokens: list[int]
    pages: list[int]
    prompt_len: int = 0
    done: int = 0
    logits: list[np.ndarray] = field(default_factory=list)  # one entry per step it ran in

    def __post_init__(self) -> None:
        self.prompt_len = self.prompt_len or len(self.tokens)


def run_step(runner: ModelRunner, reqs: list[Req], *, chunk: int | None = None,
             all_rows: frozenset[str] = frozenset()) -> None:
    """One forward over ``reqs`` in the given order: each feeds its pending tokens (at most
    ``chunk``). Its logits (every row for ids in ``all_rows``, else the last) are appended to
    ``req.logits``; a request whose pending tokens are all in then appends its greedy token,
    so prefill and decode need no separate code paths."""
    specs = []
    for r in reqs:
        n = len(r.tokens) - r.done if chunk is None else min(chunk, len(r.tokens) - r.done)
        rows = range(n) if r.rid in all_rows else [n - 1]
        specs.append(SegmentSpec(r.rid, r.tokens[r.done : r.done + n], r.done, r.pages, rows))
    out = runner.forward(build_packed_batch(specs))
    row = 0
    for r, s in zip(reqs, specs):
        k = len(s.logits_rows)
        r.logits.append(out[row : row + k])
        row += k
        r.done += len(s.token_ids)
        if r.done == len(r.tokens):
            r.tokens.append(int(np.argmax(out[row - 1])))


def pages_for(n_tokens: int) -> int:
    return -(-n_tokens // 16)


def add_common(p: argparse.ArgumentParser, steps: int) -> None:
    p.add_argument("--model", default=None, help="model to check (default: a tiny random "
                   "model with the 9/3/64 attention geometry)")
    p.add_argument("--weights", choices=("int8", "f32"), default="int8")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--steps", type=positive_int, default=steps, help="decode steps per request")
    p.add_argument("--max-prompt", type=positive_int, default=100, help="longest random prompt")
    p.add_argument("--seed", type=int, default=20260908)


def load(args: argparse.Namespace) -> Any:
    if args.model:
        from crucible.model.loader import load_model

        return load_model(args.model, args.weights)
    return check_model(args.weights)


def check_model(weights: str, max_context: int = 512) -> Any:
    """The checks' tiny random model: the default model's 9/3/64 attention geometry."""
    from crucible.model.tiny import tiny_random_model

    return tiny_random_model(seed=1, weights=weights, n_heads=9, n_kv_heads=3, head_dim=64,
                             hidden_size=192, ffn_size=256, tie_embeddings=False,
                             max_context=max_context)


def report(name: str, runner: ModelRunner, args: argparse.Namespace, passed: int, failed: int,
           t0: float) -> int:
    print(f"{name}: device {runner.device}, weights {args.weights}, model "
          f"{args.model or 'tiny-random'}: {passed} passed, {failed} failed "
          f"({time.time() - t0:.1f} s)")
    # Zero comparisons would be a vacuous pass: report it as a failure of the harness.
    return 1 if failed or not passed else 0


def check_batch(runner: ModelRunner, sizes: list[int], steps: int, max_prompt: int,
                seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    vocab, ctx = runner.config.vocab_size, runner.config.max_context
    max_prompt = min(max_prompt, ctx - steps - 1)
    needle = rng.integers(0, vocab, min(45, max_prompt)).tolist()  # 45 crosses two pages
    c = Counts()
    ref = Req("needle", list(needle), list(range(pages_for(len(needle) + steps))))
    run_step(runner, [ref], all_rows=frozenset({"needle"}))
    for _ in range(steps):
        run_step(runner, [ref])
    for b in sizes:
        free = rng.permutation(runner.num_pages).tolist()  # fresh, scattered pages per trial
        take = lambda n: [free.pop() for _ in range(pages_for(n + steps + 1))]  # noqa: E731
        me = Req("needle", list(needle), take(len(needle)))
        others = []
        for i in range(b - 1):
            toks = rng.integers(0, vocab, int(rng.integers(1, max_prompt + 1))).tolist()
            others.append(Req(f"n{i}", toks, take(len(toks))))
        early = [r for r in others if rng.random() < 0.5]
        if early:  # their decode rows will share the needle's prefill step
            run_step(runner, early)
        order = others + [me]
        for step in range(steps + 1):
            rng.shuffle(order)
            run_step(runner, order, all_rows=frozenset({"needle"}) if step == 0 else frozenset())
            c.compare(f"needle in batch {b}, step {step}", me.logits[step], ref.logits[step])
    return c.result()


def layouts(lengths: list[int], rng: np.random.Generator) -> dict[str, list[list[int]]]:
    """Page tables per layout; 'contiguous' first (the reference)."""
    need = [pages_for(n) for n in lengths]
    total, starts = sum(need), np.cumsum([0] + need)
    contiguous = [list(range(starts[i], starts[i] + n)) for i, n in enumerate(need)]
    interleaved: list[list[int]] = [[] for _ in need]
    nxt = 0
    for j in range(max(need)):  # round robin: physical neighbours belong to different requests
        for i, n in enumerate(need):
            if j < n:
                interleaved[i].append(nxt)
                nxt += 1
    perm = rng.permutation(2 * total + 1).tolist()
    return {"contiguous": contiguous, "interleaved": interleaved,
            "reversed": [t[::-1] for t in contiguous],
            "shuffled": [[perm.pop() for _ in range(n)] for n in need],
            "strided": [[2 * p + 1 for p in t] for t in interleaved]}


def check_paged(runner: ModelRunner, n_req: int, steps: int, max_prompt: int,
                seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    vocab, ctx = runner.config.vocab_size, runner.config.max_context
    # Edge lengths first: 15/16/17 and 31/33 make decode cross into a fresh page.
    lengths = [1, 15, 16, 17, 31, 33, 64, 2, 100, 47, 80, 9][:n_req]
    lengths = [min(n, max_prompt, ctx - steps - 1) for n in lengths]
    prompts = [rng.integers(0, vocab, n).tolist() for n in lengths]
    tables = layouts([n + steps + 1 for n in lengths], rng)
    c = Counts()
    ref: list[Req] = []
    for name, tabs in tables.items():
        reqs = [Req(f"r{i}", list(p), tabs[i]) for i, p in enumerate(prompts)]
        run_step(runner, reqs, chunk=23, all_rows=frozenset(r.rid for r in reqs))
        for _ in range(steps + 1):  # the rest of each prompt, mixed with decode rows
            run_step(runner, reqs)
        if not ref:
            ref = reqs
            continue
        for r, want in zip(reqs, ref):
            for step, (got, exp) in enumerate(zip(r.logits, want.logits)):
                c.compare(f"{name} {r.rid} (len {r.prompt_len}) step {step}", got, exp)
            c.check(r.tokens == want.tokens, f"{name} {r.rid} tokens")
    return c.result()


def batch_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-batch")
    add_common(p, steps=6)
    p.add_argument("--sizes", type=positive_int, nargs="+", default=list(BATCH_SIZES))
    args = p.parse_args(argv)
    t0 = time.time()
    model = load(args)
    steps, max_prompt = args.steps, min(args.max_prompt, model.config.max_context - args.steps - 1)
    runner = ModelRunner(model, num_pages=max(args.sizes) * pages_for(max_prompt + steps + 1) + 8,
                         device=args.device, settings=Settings.from_env())
    passed, failed = check_batch(runner, args.sizes, steps, max_prompt, args.seed)
    print(f"needle alone vs inside batches of {args.sizes}, {steps} decode steps")
    return report("gpu-batch", runner, args, passed, failed, t0)


def paged_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-paged")
    add_common(p, steps=5)
    p.add_argument("--requests", type=int_in(1, 12), default=12, help="requests per layout (<= 12)")
    args = p.parse_args(argv)
    t0 = time.time()
    model = load(args)
    n_pages = 2 * sum(pages_for(args.max_prompt + args.steps + 1) for _ in range(12)) + 2
    runner = ModelRunner(model, num_pages=n_pages, device=args.device,
                         settings=Settings.from_env())
    passed, failed = check_paged(runner, args.requests, args.steps, args.max_prompt, args.seed)
    print("layouts interleaved/reversed/shuffled/strided vs contiguous, "
          f"{args.requests} requests, {args.steps} decode steps")
    return report("gpu-paged", runner, args, passed, failed, t0)


if __name__ == "__main__":
    sys.exit(batch_main(sys.argv[1:]))
