"""Offline throughput in the shape of vLLM's benchmark: every request handed to one generate.

    python bench/throughput.py                                   # default model, random mix
    python bench/throughput.py --workload chat --rounds 3
    python bench/throughput.py --model tiny-random --device cpu --requests 256 \\
        --prompt-min 16 --prompt-max 95 --output-min 32 --output-max 95 --num-pages 4096

Workloads (``--workload``; ``--requests``, ``--seed`` and the four length bounds override):

* ``random`` (default): vLLM's offline throughput benchmark. N=1,000 requests of random
  token ids, prompt lengths uniform in 64..1023, output lengths uniform in 128..511,
  exactly that many generated (``ignore_eos``), all given to ``LLM.generate`` at once.
* ``chat``: a chat-like mix. Prompt lengths lognormal with median 300 tokens and sigma 1.0
  (about 95% within 42..2,100), clipped to 20..2,000; output lengths lognormal with median
  150 and sigma 0.8 (about 95% within 31..720), clipped to 16..512. Why: chat prompts
  carry a system prompt and the conversation so far, so they are mostly a few hundred
  tokens with a long tail of long histories, and replies are mostly one to a few
  paragraphs, rarely past 500 tokens. The medians sit between single-turn chat logs
  (LMSYS-Chat-1M: user turns of tens of tokens, replies of a couple of hundred) and
  production conversation traces that include the history (prompts around a thousand
  tokens, replies around 130); a lognormal gives both the bulk and the tail. Output
  lengths are drawn independently of prompt lengths.

Both mixes are clipped to the model's context: an output is cut to context - 1 tokens,
then the prompt to context - output (a chat client drops old history first), so every
request generates exactly its drawn output length. Prompt ids are uniform over the
vocabulary minus the tokenizer's stop ids. ``tiny-random`` is
``tiny_random_model(seed=0)`` (context ``--tiny-context``, 512); with ``--device cuda`` it
gets head_dim 64 (TINY_CUDA_GEOMETRY), the only one the CUDA kernels take. Sampling is vLLM's: temperature 1.0, top-p 1.0
(``--temperature 0`` for greedy).

Measurement (public API only; nothing in the library changes): a warm-up of 8 requests of
the same mix (own seed) runs first, untimed, its captures reported apart. Then each of
``--rounds`` rounds times one ``llm.generate`` of the whole workload on the same LLM.
Per round: wall time, prompt/output tokens, total and output tok/s, req/s, engine steps
(``engine.num_steps``: forwards launched, pipelined ones included), mean rows per step
(``engine.num_rows / steps``), preemptions, pipelined (chained) steps. A wrapper object
replaces, on the instance only, ``engine.step`` (per call: wall time, rows, launches and
the running requests: ``len(scheduler.running)`` after the call plus the requests that
finished in it) and ``runner.forward`` (host sampling, ``runner.sampler is None``) or
``runner.launch_sample`` (device sampling): host ms is the CPU-clock time inside that call
per launch; on the CPU that is the forward itself, on CUDA the launch (asynchronous).
``engine overhead ms`` is a step call's wall less its launches' host ms (scheduling, batch
build, validation, host sampling, updates). On CUDA, when cupy imports, a CUDA event is
recorded on the current stream at the start and end of each step call; GPU ms is the time
between them on the device (it includes device idle while the host prepares, and with
pipelining a call's span includes the decode step it queued ahead). Graph counters (CuPy
backend): decode and prefill graph replays and captures; eager steps = steps - replays.

The running-requests histogram bins the timed calls by running requests; its tok/s is rows
over wall time per bin (bench/throughput_plot.py, which also draws the PNG: matplotlib
when it imports, else serve_plot's stdlib rasterizer). The JSON (``--json``, default
bench/results/throughput-<model>-<device>-<workload>.json) holds the command line, the
configuration with the LLM's settings, per-round figures and their median/min/max, the
per-step stats (mean, p50, p99) and the histogram. A short table prints last.

Exactness probes (``--probes K``, default 4; 0: off): K requests of the workload, spread
over its prompt lengths (the K quantiles of the length-sorted order, distinct lengths where
the mix has them), get their own params: ``logprobs=5``, a fixed ``seed`` (so the draw does
not hang on arrival order) and, alternately, seeded sampling (``--temperature``, or 1.0 when
that is 0) and greedy; the rest of the workload keeps its params. After the warm-up each
probe runs ALONE on the same LLM (``llm.generate([prompt], [params])``, untimed, reported
apart as ``probes_alone``); every timed round then carries the probes inside the workload,
and each probe's token ids and logprobs are compared with its alone run bitwise (per token:
the id, the logprob dict's keys in order, the values as f64 bit patterns). The JSON's
``probes`` lists index, prompt/output tokens, temperature, seed, ``identical`` and
``first_diff`` (round, token position, what differed, both sides); the table prints
``probes identical: k/K``, and the script exits 1 (after writing the JSON) when any probe
differs. The probes are K of the N requests, so their logprobs (a log-softmax and a top-5
per token, and no argmax fast path for the greedy ones) barely move the throughput figure.
``--probe-negative-control`` (manual use) gives the first sampled probe's alone run a
different seed, so the check must report a difference and exit 1: it shows the check can
fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import random
import shlex
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import stat, write_json  # noqa: E402
from throughput_plot import bin_by_running, draw  # noqa: E402

from crucible import LLM, SamplingParams  # noqa: E402

DEFAULT_MODEL = "smollm2-135m-instruct"  # crucible.model.fetch.DEFAULT_MODEL
TINY = "tiny-random"
WARMUP_REQUESTS = 8
TINY_CUDA_GEOMETRY = dict(hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_size=512)
# name -> (prompt min, max, output min, max); chat adds the lognormal medians and sigmas.
MIXES = {"random": (64, 1023, 128, 511), "chat": (20, 2000, 16, 512)}
CHAT_SHAPE = {"prompt_median": 300, "prompt_sigma": 1.0,
              "output_median": 150, "output_sigma": 0.8}


# -- the workload ---------------------------------------------------------------------------
def lengths(kind: str, n: int, bounds: tuple[int, int, int, int], context: int,
            rng: random.Random) -> tuple[list[tuple[int, int]], int]:
    """(prompt length, output length) per request, and how many the context clipped."""
    pmin, pmax, omin, omax = bounds
    out, clipped = [], 0
    for _ in range(n):
        if kind == "random":
            p, o = rng.randint(pmin, pmax), rng.randint(omin, omax)
        else:
            p = round(rng.lognormvariate(math.log(CHAT_SHAPE["prompt_median"]),
                                         CHAT_SHAPE["prompt_sigma"]))
            o = round(rng.lognormvariate(math.log(CHAT_SHAPE["output_median"]),
                                         CHAT_SHAPE["output_sigma"]))
            p, o = min(max(p, pmin), pmax), min(max(o, omin), omax)
        o2 = min(o, context - 1)
        p2 = min(p, context - o2)
        clipped += (p2, o2) != (p, o)
        out.append((p2, o2))
    return out, clipped


def prompts_for(sizes: list[tuple[int, int]], ids: list[int], rng: random.Random
                ) -> list[list[int]]:
    return [[rng.choice(ids) for _ in range(p)] for p, _ in sizes]


# -- the LLM --------------------------------------------------------------------------------
def make_llm(args: argparse.Namespace) -> LLM:
    given = {k: getattr(args, k) for k in ("device", "weights", "num_pages", "max_running",
                                           "token_budget") if getattr(args, k) is not None}
    model: Any = args.model
    if args.model == TINY:
        from crucible.model.tiny import tiny_random_model

        # The CUDA kernels take head_dim 64 only: on --device cuda the tiny model gets it.
        geometry = TINY_CUDA_GEOMETRY if args.device == "cuda" else {}
        model = tiny_random_model(seed=0, weights=args.weights or "f32",
                                  max_context=args.tiny_context, **geometry)
    return LLM(model, **given)


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def graph_counters(llm: LLM) -> dict[str, int]:
    """The CuPy backend's graph counters (empty elsewhere, or with graphs off)."""
    be = llm.engine.runner.backend
    out: dict[str, int] = {}
    for prefix, attr, fields in (("decode", "graphs", ("num_replays", "num_captures")),
                                 ("prefill", "prefill_graphs",
                                  ("num_replays", "num_captures", "num_eager"))):
        g = getattr(be, attr, None)
        if g is not None:
            for f in fields:
                out[f"{prefix}_{f[4:]}"] = int(getattr(g, f))
    return out


# -- the probe ------------------------------------------------------------------------------
class Probe:
    """Times engine.step calls and the runner's forward/launch by wrapping them on the
    instances (the classes are untouched); ``close`` puts the instances back."""

    def __init__(self, llm: LLM) -> None:
        self.engine = eng = llm.engine
        self.runner = runner = eng.runner
        self.call_name = "forward" if runner.sampler is None else "launch_sample"
        self._step: Callable[[], Any] = eng.step
        self._call: Callable[..., Any] = getattr(runner, self.call_name)
        self.cp = None
        if runner.device == "cuda":
            try:
                import cupy

                self.cp = cupy
            except ImportError:
                pass
        self.reset()
        eng.step = self.step  # type: ignore[method-assign]
        setattr(runner, self.call_name, self.call)

    def reset(self) -> None:
        self.samples: list[tuple[float, int, int, int]] = []  # wall, rows, launches, running
        self.call_ms: list[float] = []  # per launch
        self.overhead_ms: list[float] = []  # per step call that launched
        self.events: list[tuple[Any, Any]] = []
        self._in_step_ms = 0.0

    def call(self, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return self._call(*a, **k)
        finally:
            ms = (time.perf_counter() - t) * 1e3
            self.call_ms.append(ms)
            self._in_step_ms += ms

    def step(self) -> Any:
        eng = self.engine
        rows0, launches0 = eng.num_rows, eng.num_steps
        self._in_step_ms = 0.0
        ev0 = None
        if self.cp is not None:
            ev0 = self.cp.cuda.Event()
            ev0.record()
        t = time.perf_counter()
        deltas = self._step()
        wall = time.perf_counter() - t
        if ev0 is not None:
            ev1 = self.cp.cuda.Event()
            ev1.record()
            self.events.append((ev0, ev1))
        launches = eng.num_steps - launches0
        running = len(eng.scheduler.running) + sum(1 for d in deltas if d.finished)
        self.samples.append((wall, eng.num_rows - rows0, launches, running))
        if launches:
            self.overhead_ms.append(wall * 1e3 - self._in_step_ms)
        return deltas

    def gpu_ms(self) -> list[float]:
        if not self.events:
            return []
        self.events[-1][1].synchronize()
        return [self.cp.cuda.get_elapsed_time(a, b) for a, b in self.events]

    def close(self) -> None:
        del self.engine.step
        delattr(self.runner, self.call_name)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def dist(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"n": len(values), "mean": round(statistics.fmean(values), 4),
            "p50": round(pct(values, 0.5), 4), "p99": round(pct(values, 0.99), 4)}


# -- exactness probes -----------------------------------------------------------------------
PROBE_LOGPROBS = 5
PROBE_SEED_BASE = 7_000_003  # probe i's seed: PROBE_SEED_BASE + workload index


def pick_probes(sizes: list[tuple[int, int]], k: int) -> list[int]:
    """K workload indices spread over the prompt lengths: the K quantile midpoints of the
    length-sorted order, moved to the nearest unused distinct length where there is one."""
    k = min(k, len(sizes))
    if k <= 0:
        return []
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i][0], i))
    picked: list[int] = []
    lens: set[int] = set()
    for j in range(k):
        pos = min(len(order) - 1, int((j + 0.5) * len(order) / k))
        cands = sorted(range(len(order)), key=lambda q: abs(q - pos))
        choice = next((order[q] for q in cands if order[q] not in picked
                       and sizes[order[q]][0] not in lens), None)
        if choice is None:
            choice = next(order[q] for q in cands if order[q] not in picked)
        picked.append(choice)
        lens.add(sizes[choice][0])
    return picked


def probe_params(j: int, index: int, max_tokens: int, temperature: float) -> SamplingParams:
    """Even j: seeded sampling; odd j: greedy. Both ask for logprobs, with a fixed seed."""
    temp = (temperature if temperature > 0 else 1.0) if j % 2 == 0 else 0.0
    return SamplingParams(max_tokens=max_tokens, temperature=temp, ignore_eos=True,
                          seed=PROBE_SEED_BASE + index, logprobs=PROBE_LOGPROBS)


def f64_bits(v: float) -> str:
    return struct.pack("<d", v).hex()


def first_difference(alone: Any, inside: Any) -> dict[str, Any] | None:
    """The first token position where two outputs of one request differ (ids, logprob keys
    in order, logprob values as f64 bit patterns), or None when they are bitwise equal."""
    a_ids, b_ids = list(alone.token_ids), list(inside.token_ids)
    a_lp, b_lp = alone.logprobs, inside.logprobs
    if (a_lp is None) != (b_lp is None):
        return {"position": None, "what": "logprobs present on one side only"}
    n = max(len(a_ids), len(b_ids))
    for i in range(n):
        if i >= len(a_ids) or i >= len(b_ids):
            return {"position": i, "what": "length", "alone": len(a_ids),
                    "workload": len(b_ids)}
        if a_ids[i] != b_ids[i]:
            return {"position": i, "what": "token", "alone": a_ids[i], "workload": b_ids[i]}
        if a_lp is None:
            continue
        if i >= len(a_lp) or i >= len(b_lp):
            return {"position": i, "what": "logprobs length", "alone": len(a_lp),
                    "workload": len(b_lp)}
        da, db = a_lp[i], b_lp[i]
        if list(da) != list(db):
            return {"position": i, "what": "logprob keys", "alone": list(da),
                    "workload": list(db)}
        for t in da:
            if f64_bits(da[t]) != f64_bits(db[t]):
                return {"position": i, "what": "logprob value", "token": t,
                        "alone": repr(da[t]), "workload": repr(db[t]),
                        "alone_bits": f64_bits(da[t]), "workload_bits": f64_bits(db[t])}
    if a_lp is not None and len(a_lp) != len(b_lp):
        return {"position": n, "what": "logprobs length", "alone": len(a_lp),
                "workload": len(b_lp)}
    return None


# -- a run ----------------------------------------------------------------------------------
def timed_generate(llm: LLM, probe: Probe, prompts: list[list[int]],
                   params: list[SamplingParams]) -> dict[str, Any]:
    eng = llm.engine
    probe.reset()
    s0 = dict(steps=eng.num_steps, rows=eng.num_rows, chained=eng.num_chained,
              pre=llm.stats()["preemptions"])
    g0 = graph_counters(llm)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t
    g1 = graph_counters(llm)
    steps, rows = eng.num_steps - s0["steps"], eng.num_rows - s0["rows"]
    n_prompt = sum(len(o.prompt_token_ids) for o in outs)
    n_out = sum(len(o.token_ids) for o in outs)
    step_ms = [s[0] * 1e3 for s in probe.samples if s[2]]
    graphs = {k: g1[k] - g0.get(k, 0) for k in g1}
    r: dict[str, Any] = {
        "wall_s": round(wall, 4), "requests": len(outs), "prompt_tokens": n_prompt,
        "output_tokens": n_out, "total_tok_per_s": round((n_prompt + n_out) / wall, 1),
        "output_tok_per_s": round(n_out / wall, 1), "req_per_s": round(len(outs) / wall, 3),
        "steps": steps, "step_calls": len(probe.samples), "rows": rows,
        "mean_rows_per_step": round(rows / steps, 2) if steps else None,
        "chained_steps": eng.num_chained - s0["chained"],
        "preemptions": llm.stats()["preemptions"] - s0["pre"],
        "not_length_finish": sum(o.finish_reason != "length" for o in outs),
        "step_call_wall_ms": dist(step_ms),
        f"host_ms_in_{probe.call_name}": dist(probe.call_ms),
        "engine_overhead_ms": dist(probe.overhead_ms),
        "gpu_ms_per_step_call": dist(probe.gpu_ms()),
        "graphs": graphs,
    }
    if graphs:
        replays = graphs.get("decode_replays", 0) + graphs.get("prefill_replays", 0)
        r["graph_replays"] = replays
        r["eager_steps"] = steps - replays
        r["captures_in_timed_run"] = (graphs.get("decode_captures", 0)
                                      + graphs.get("prefill_captures", 0))
    r["_samples"] = list(probe.samples)
    r["_outs"] = outs
    return r


ROUND_FIGURES = ("wall_s", "total_tok_per_s", "output_tok_per_s", "req_per_s", "steps",
                 "mean_rows_per_step", "preemptions", "chained_steps", "graph_replays",
                 "eager_steps", "captures_in_timed_run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=tuple(MIXES), default="random")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--prompt-min", type=int)
    ap.add_argument("--prompt-max", type=int)
    ap.add_argument("--output-min", type=int)
    ap.add_argument("--output-max", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help=f"a model name or path; {TINY!r}: tiny_random_model(seed=0)")
    ap.add_argument("--tiny-context", type=int, default=512, help="tiny-random's context")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--weights", choices=("int8", "f32"), help="default: the library's "
                    "(int8); tiny-random: f32")
    ap.add_argument("--num-pages", type=int)
    ap.add_argument("--max-running", type=int)
    ap.add_argument("--token-budget", type=int)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="default: bench/results/throughput-<model>-<device>-"
                    "<workload>.json")
    ap.add_argument("--plot", help="PNG path (default: the JSON's with .png); 'none': no plot")
    ap.add_argument("--probes", type=int, default=4,
                    help="exactness probes: K requests of the workload also run alone and "
                    "compared bitwise (0: off)")
    ap.add_argument("--probe-negative-control", action="store_true",
                    help="manual check of the check: the first sampled probe's alone run "
                    "gets another seed, so a difference must be reported (exit 1)")
    args = ap.parse_args(argv)
    if args.probes < 0:
        ap.error("--probes must be >= 0")
    defaults = MIXES[args.workload]
    bounds = tuple(d if v is None else v for v, d in zip(
        (args.prompt_min, args.prompt_max, args.output_min, args.output_max), defaults))
    if not (1 <= bounds[0] <= bounds[1] and 1 <= bounds[2] <= bounds[3]):
        ap.error(f"bad length bounds {bounds}")

    t_load = time.perf_counter()
    llm = make_llm(args)
    load_s = time.perf_counter() - t_load
    device = llm.engine.runner.device
    context = llm.engine.max_context
    stops = set(llm.tokenizer.stop_token_ids)
    ids = [t for t in range(llm.model.config.vocab_size) if t not in stops]
    rng = random.Random(args.seed)
    sizes, clipped = lengths(args.workload, args.requests, bounds, context, rng)
    prompts = prompts_for(sizes, ids, rng)
    params = [SamplingParams(max_tokens=o, temperature=args.temperature, ignore_eos=True)
              for _, o in sizes]
    probe_idx = pick_probes(sizes, args.probes)
    alone_params: list[SamplingParams] = []
    for j, i in enumerate(probe_idx):
        params[i] = probe_params(j, i, sizes[i][1], args.temperature)
        alone_params.append(params[i])
    control = None  # the probe whose alone run gets another seed (--probe-negative-control)
    if args.probe_negative_control and probe_idx:
        control = next((j for j, p in enumerate(alone_params) if not p.greedy), 0)
        pc = alone_params[control]
        alone_params[control] = dataclasses.replace(
            pc, seed=pc.seed + 1, temperature=pc.temperature if pc.temperature > 0 else 1.0)
    wrng = random.Random(args.seed + 1_000_003)
    wsizes, _ = lengths(args.workload, WARMUP_REQUESTS, bounds, context, wrng)
    wprompts = prompts_for(wsizes, ids, wrng)
    wparams = [SamplingParams(max_tokens=o, temperature=args.temperature, ignore_eos=True)
               for _, o in wsizes]
    print(f"model={llm.model.name} device={device} backend={llm.info.backend} "
          f"weights={llm.model.weights_mode} context={context} pages={llm.info.pages} "
          f"budget={llm.info.token_budget} max_running={llm.info.max_running} "
          f"workload={args.workload} requests={args.requests} "
          f"prompt_tokens={sum(p for p, _ in sizes)} output_tokens={sum(o for _, o in sizes)} "
          f"clipped={clipped} load_s={load_s:.2f}", flush=True)

    probe = Probe(llm)
    try:
        warm = timed_generate(llm, probe, wprompts, wparams)
        warm.pop("_samples")
        warm.pop("_outs")
        print(f"warm-up: {warm['wall_s']} s, {warm['steps']} steps, graphs {warm['graphs']}",
              flush=True)
        alone_outs = []
        probe.reset()
        g0 = graph_counters(llm)
        t_alone = time.perf_counter()
        for i, p in zip(probe_idx, alone_params):
            alone_outs.append(llm.generate([prompts[i]], [p])[0])
        alone_info = {"wall_s": round(time.perf_counter() - t_alone, 4),
                      "graphs": {k: v - g0.get(k, 0) for k, v in graph_counters(llm).items()}}
        if probe_idx:
            print(f"probes alone: {len(probe_idx)} requests (indices {probe_idx}), "
                  f"{alone_info['wall_s']} s untimed", flush=True)
        diffs: list[dict[str, Any] | None] = [None] * len(probe_idx)
        rounds, samples = [], []
        for r in range(args.rounds):
            res = timed_generate(llm, probe, prompts, params)
            samples.extend(res.pop("_samples"))
            outs = res.pop("_outs")
            for j, i in enumerate(probe_idx):
                if diffs[j] is None:
                    d = first_difference(alone_outs[j], outs[i])
                    if d is not None:
                        diffs[j] = {"round": r, **d}
            rounds.append(res)
            print(f"round {r}: {res['wall_s']} s, {res['total_tok_per_s']} tok/s total, "
                  f"{res['output_tok_per_s']} out tok/s, {res['req_per_s']} req/s, "
                  f"{res['steps']} steps, {res['mean_rows_per_step']} rows/step, "
                  f"{res['preemptions']} preemptions", flush=True)
    finally:
        probe.close()

    tag = "tiny" if args.model == TINY else Path(args.model).name
    json_path = Path(args.json) if args.json else (
        Path(__file__).resolve().parent / "results"
        / f"throughput-{tag}-{device}-{args.workload}.json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    hist = bin_by_running(samples)
    summary = {k: stat([r[k] for r in rounds]) for k in ROUND_FIGURES
               if rounds and all(r.get(k) is not None for r in rounds)}
    per_step: dict[str, Any] = {}
    for k in rounds[0]:
        if (k.endswith("_ms") or "_ms_" in k) and all(isinstance(r[k], dict) for r in rounds):
            per_step[k] = {m: stat([r[k][m] for r in rounds]) for m in ("mean", "p50", "p99")}
    result: dict[str, Any] = {
        "bench": "throughput",
        "command": "python3 bench/throughput.py " + shlex.join(sys.argv[1:] if argv is None
                                                                else argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "config": {"model": llm.model.name, "device": device, "backend": llm.info.backend,
                   "weights": llm.model.weights_mode, "context": context,
                   "pages": llm.info.pages, "workload": args.workload,
                   "requests": args.requests, "seed": args.seed,
                   "temperature": args.temperature,
                   "lengths": dict(zip(("prompt_min", "prompt_max", "output_min",
                                        "output_max"), bounds)),
                   **({"chat_shape": CHAT_SHAPE} if args.workload == "chat" else {}),
                   "clipped_to_context": clipped,
                   "prompt_tokens": sum(p for p, _ in sizes),
                   "output_tokens": sum(o for _, o in sizes),
                   "timed_call": f"runner.{probe.call_name}",
                   "cuda_events": probe.cp is not None,
                   "load_s": round(load_s, 3),
                   "settings": plain(llm.settings), "engine_info": plain(llm.info)},
        "warmup": warm,
        "rounds": rounds,
        "summary": summary,
        "per_step": per_step,
        "running_histogram": hist,
        "probes_alone": {**alone_info, "negative_control": args.probe_negative_control,
                         "logprobs": PROBE_LOGPROBS},
        "probes": [{"index": i, "prompt_tokens": sizes[i][0], "output_tokens": sizes[i][1],
                    "temperature": params[i].temperature, "seed": params[i].seed,
                    **({"alone_seed": alone_params[j].seed} if j == control else {}),
                    "identical": diffs[j] is None, "first_diff": diffs[j]}
                   for j, i in enumerate(probe_idx)],
    }
    if args.plot != "none":
        plot_path = Path(args.plot) if args.plot else json_path.with_suffix(".png")
        plot_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            info = draw(plot_path, hist, f"{llm.model.name} {device} {args.workload}: "
                        "tok/s vs running requests")
            result["plot"] = info
            if info.get("renderer") != "matplotlib":
                print(f"matplotlib is absent: {plot_path} drawn by serve_plot's stdlib "
                      "rasterizer (unlabelled axes)", flush=True)
        except Exception as exc:  # a plot never fails the bench
            print(f"plot skipped: {exc}", flush=True)
    write_json(str(json_path), result)
    table(result)
    return 1 if any(not p["identical"] for p in result["probes"]) else 0


def table(result: dict[str, Any]) -> None:
    rows = [(k, v) for k, v in result["summary"].items()]
    rows += [(f"{k} {m}", v[m]) for k, v in result["per_step"].items()
             for m in ("mean", "p99")]
    hist = result["running_histogram"]
    print(f"\n{result['config']['model']} on {result['config']['device']}, "
          f"{result['config']['workload']} x{result['config']['requests']}, "
          f"{len(result['rounds'])} round(s)")
    print(f"{'figure':38s} {'median':>12s} {'min':>12s} {'max':>12s}")
    for name, s in rows:
        print(f"{name:38s} {s['median']:12.4g} {s['min']:12.4g} {s['max']:12.4g}")
    if hist:
        busiest = max(hist, key=lambda b: b["time_share"])
        print(f"running requests: up to {hist[-1]['running_max']}; most time at "
              f"{busiest['running_lo']}-{busiest['running_hi']} "
              f"({busiest['time_share']:.0%} of step time, {busiest['tok_per_s']} tok/s)")
    probes = result["probes"]
    if probes:
        same = sum(p["identical"] for p in probes)
        neg = " (negative control)" if result["probes_alone"]["negative_control"] else ""
        print(f"probes identical: {same}/{len(probes)}{neg}")
        for p in probes:
            if not p["identical"]:
                print(f"  probe {p['index']} (prompt {p['prompt_tokens']}, temperature "
                      f"{p['temperature']}) differs: {p['first_diff']}")


if __name__ == "__main__":
    sys.exit(main())
