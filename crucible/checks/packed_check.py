"""``llm-engine gpu-packed-prefill-check``: whole generated sequences, packed vs alone.

Every request runs alone with reference attention first. Then the same requests run
through the engine under each packing variation with the selected attention variant. Tokens,
generated logprobs and prompt logprobs must be identical, bit for bit. Identical tokens from
the same (seed, n) also mean identical RNG draws. The variations are:

- all packed, token budgets 32/64/128/256 and 37/73/131, three arrival orders;
- neighbours cancelled at steps 0/1/3/6, with their pages reused at once;
- a 32-page pool (admission waits) and the tightest pool that holds the largest request
  (decode growth preempts);
- ``--fuzz`` random workloads with random budgets and sampling (greedy, top-k 5/40/128/500
  at several temperatures, top-p);
- max_tokens=1 rows that finish together.

Also: the 20 malformed batches of ``malformed.py`` must each be refused before any device
work. With an online attention variant the check must report divergence and fail: that
is the negative control. It runs on any device; `--device cpu` checks the harness.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.arg_types import non_negative_int, positive_int

Outcome = tuple[list[int], list[dict], Any, Any]  # tokens, logprobs, prompt logprobs, reason
KINDS = [dict(temperature=0.0), dict(temperature=0.8, top_k=5), dict(temperature=0.8, top_k=40),
         dict(temperature=1.0, top_k=128), dict(temperature=0.7, top_k=500),
         dict(temperature=0.9, top_p=0.9)]


def run_workload(model: Any, prompts: list[list[int]], params: list[SamplingParams], *,
                 device: str = "cpu", attention: str | None = None, budget: int = 1024,
                 chunk_cap: int | None = None, num_pages: int = 128,
                 order: list[int] | None = None, aborts: dict[int, list[str]] | None = None,
                 max_running: int = 256, gemm: str = "fma", wgmma: bool | None = False
                 ) -> tuple[dict[str, Outcome], dict[str, int]]:
    """Run requests ``str(i)`` to the end; abort ``aborts[step]`` before that step.
    ``gemm``: the int8 GEMMs' order (CRUCIBLE_GEMM), the same for both sides of a check;
    ``wgmma`` (CRUCIBLE_WGMMA; None: where the GPU runs it) only on the packed side, so
    that side's warpgroup-MMA GEMMs are checked against the plain mma ones run alone."""
    runner = ModelRunner(model, num_pages=num_pages, device=device, attention=attention,
                         settings=Settings(gemm=gemm, wgmma=wgmma))
    eng = LLMEngine(runner, model.tokenizer, SchedulerConfig(
        token_budget=budget, chunk_cap=chunk_cap, max_running=max_running,
        max_queue=max(64, len(prompts))))
    order = list(range(len(prompts))) if order is None else order
    for i in order:
        eng.add_request(prompts[i], params[i], request_id=str(i))
    out: dict[str, Outcome] = {str(i): ([], [], None, None) for i in order}
    step = 0
    while eng.has_unfinished():
        for rid in (aborts or {}).get(step, ()):
            eng.abort(rid)
        for d in eng.step():
            toks, lps, plp, _ = out[d.request_id]
            toks.extend(d.new_token_ids)
            lps.extend(d.new_logprobs or ())
            if d.prompt_logprobs is not None:
                plp = d.prompt_logprobs
            out[d.request_id] = (toks, lps, plp, d.finish_reason)
        step += 1
    if eng.allocator.num_free != num_pages:
        raise AssertionError(f"pages leaked: {num_pages - eng.allocator.num_free}")
    return out, eng.stats()


def one_at_a_time(model: Any, prompts: list[list[int]], params: list[SamplingParams], *,
                  device: str = "cpu", attention: str | None = None,
                  gemm: str = "fma") -> dict[str, Outcome]:
    out = {}
    for i in range(len(prompts)):
        r, _ = run_workload(model, [prompts[i]], [params[i]], device=device,
                            attention=attention, num_pages=64, gemm=gemm, wgmma=False)
        out[str(i)] = r["0"]
    return out


def workload(rnd: random.Random, n: int, steps: int, vocab: int, context: int
             ) -> tuple[list[list[int]], list[SamplingParams]]:
    lengths = [rnd.choice([1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 129, 200])
               for _ in range(n)]
    prompts = [[rnd.randrange(vocab) for _ in range(min(L, context - steps))] for L in lengths]
    params = [SamplingParams(max_tokens=rnd.choice([1, steps // 2 or 1, steps]),
                             logprobs=2, prompt_logprobs=1, seed=rnd.randrange(1 << 30),
                             ignore_eos=True, **rnd.choice(KINDS)) for _ in range(n)]
    return prompts, params


class Report:
    def __init__(self) -> None:
        self.sequences = self.runs = self.failures = 0

    def compare(self, label: str, got: dict[str, Outcome], ref: dict[str, Outcome],
                skip: set[str] = frozenset()) -> None:
        self.runs += 1
        for rid, want in ref.items():
            if rid in skip:
                if got[rid][0] != want[0][: len(got[rid][0])]:
                    self.fail(f"{label}: cancelled request {rid} is not a prefix")
                continue
            self.sequences += 1
            if got[rid] != want:
                self.fail(f"{label}: request {rid} diverged (tokens {got[rid][0][:8]} vs "
                          f"{want[0][:8]})")

    def fail(self, msg: str) -> None:
        self.failures += 1
        if self.failures <= 10:
            print(f"DIVERGED {msg}", flush=True)


def check_malformed(report: Report, vocab: int) -> int:
    from crucible.engine.validate import validate_packed_batch
    from crucible.errors import BatchValidationError
    from crucible.checks.malformed import CASES, valid_batch

    rejected = 0
    for name, mutate in CASES.items():
        try:
            validate_packed_batch(mutate(valid_batch()), num_pages=16, vocab_size=vocab)
            report.fail(f"malformed batch accepted: {name}")
        except BatchValidationError:
            rejected += 1
    return rejected


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-packed-prefill-check")
    p.add_argument("--model", default=None, help="model to check (default: a tiny random "
                   "model with the 9/3/64 attention geometry)")
    p.add_argument("--weights", choices=("int8", "f32"), default="int8")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--steps", type=positive_int, default=16, help="tokens generated per request at most")
    p.add_argument("--fuzz", type=non_negative_int, default=24, help="random workloads")
    p.add_argument("--seed", type=int, default=20260908)
    args = p.parse_args(argv)
    env = Settings.from_env()
    selected = env.attention
    if args.model:
        from crucible.model.loader import load_model

        model = load_model(args.model, args.weights)
    else:
        from crucible.model.tiny import tiny_random_model

        model = tiny_random_model(seed=1, weights=args.weights, n_heads=9, n_kv_heads=3,
                                  head_dim=64, hidden_size=192, ffn_size=256,
                                  tie_embeddings=False, max_context=512)
    vocab, ctx = model.config.vocab_size, model.config.max_context
    t0 = time.time()
    rnd = random.Random(args.seed)
    rep = Report()
    kw = dict(device=args.device, attention=selected, gemm=env.gemm, wgmma=env.wgmma)

    def alone(prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, Outcome]:
        return one_at_a_time(model, prompts, params, device=args.device, attention="reference",
                             gemm=env.gemm)

    def progress(stage: str) -> None:  # a long run cut short still says how far it got
        print(f"  {stage}: {rep.runs} packed runs, {rep.sequences} sequences, "
              f"{rep.failures} failures ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    prompts, params = workload(rnd, 16, args.steps, vocab, ctx)
    ref = alone(prompts, params)
    shuffled = list(range(16))
    rnd.shuffle(shuffled)
    for budget in (1024, 32, 64, 128, 256, 37, 73, 131):
        for name, order in (("fifo", list(range(16))), ("reverse", list(range(16))[::-1]),
                            ("shuffled", shuffled)):
            got, _ = run_workload(model, prompts, params, budget=budget, order=order, **kw)
            rep.compare(f"budget {budget} {name}", got, ref)
    progress("chunk budgets x packing orders")
    aborts = {0: ["3"], 1: ["7"], 3: ["11"], 6: ["14"]}
    for budget in (1024, 37):
        got, _ = run_workload(model, prompts, params, budget=budget, aborts=aborts,
                              num_pages=40, **kw)
        rep.compare(f"cancel neighbours, budget {budget}", got, ref,
                    skip={r for rs in aborts.values() for r in rs})
    from crucible.engine.pages import pages_for

    tightest = max(pages_for(len(pr) + pa.max_tokens - 1) for pr, pa in zip(prompts, params))
    preemptions = 0
    for pages in (32, tightest):  # admission waits; decode growth that must preempt
        got, stats = run_workload(model, prompts, params, budget=131, num_pages=pages, **kw)
        rep.compare(f"{pages}-page pool", got, ref)
        preemptions += stats["preemptions"]
    progress("cancellations and small pools")
    ones = [SamplingParams(max_tokens=1, logprobs=2, seed=i, **KINDS[i % len(KINDS)])
            for i in range(8)]
    rep.compare("max_tokens=1", run_workload(model, prompts[:8], ones, **kw)[0],
                alone(prompts[:8], ones))
    for f in range(args.fuzz):
        fp, fpar = workload(rnd, rnd.randint(4, 16), args.steps, vocab, ctx)
        got, _ = run_workload(model, fp, fpar, budget=rnd.choice([16, 37, 64, 200, 1024]),
                              num_pages=rnd.choice([32, 64, 128]), **kw)
        rep.compare(f"fuzz {f}", got, alone(fp, fpar))
        progress(f"fuzz set {f + 1}/{args.fuzz}")
    rejected = check_malformed(rep, vocab)
    print(f"gpu-packed-prefill-check: attention {selected} vs reference alone, device "
          f"{args.device}, weights {args.weights}: {rep.sequences} sequences in {rep.runs} "
          f"packed runs ({args.fuzz} fuzz sets), {preemptions} preemptions in the 32-page "
          f"and tightest pools, {rejected}/20 malformed batches rejected, {rep.failures} "
          f"failures ({time.time() - t0:.0f} s)")
    if rep.failures:
        print("FAIL: packed output diverged from one-at-a-time reference"
              + (" (expected: online attention is a diagnostic)" if "online" in selected
                 else ""))
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
