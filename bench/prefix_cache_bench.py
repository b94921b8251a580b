"""Prefix cache on vs off in one run: multi-turn chat (TTFT, tok/s) and a miss-only mix.

    python bench/prefix_cache_bench.py                          # default model, both workloads
    python bench/prefix_cache_bench.py --model /tmp/smollm2.gguf --device cuda --rounds 2
    python bench/prefix_cache_bench.py --model tiny-random --device cpu --users 16 --turns 4 \\
        --system-tokens 500 --reply-tokens 16 --rounds 2 --miss-requests 64

Each measured run gets a fresh ``LLM`` on the same loaded model object, with
``Settings(prefix_cache_size=None)`` (cache on, sized by the pool) or ``0`` (off); nothing
else differs. Each of ``--rounds`` rounds runs every workload once per config, the order
alternating (round 0: on, off; round 1: off, on; ...). Before its timed part every fresh
LLM runs an untimed warm-up of unrelated prompts (own seed: kernels compiled, graphs
captured), so neither config pays first-use costs in the figures; cache counters are
taken as differences over the timed part.

* ``chat``: ``--users`` concurrent users, each a closed loop of ``--turns`` turns
  that resend the whole conversation (bench/prefix_chat.py says how, and what is timed).
* ``miss``: ``--miss-requests`` unique random prompts (``--miss-prompt-min``..``max`` ids),
  ``--miss-output`` greedy tokens each (``ignore_eos``), all at once through
  ``llm.generate`` (bench/throughput_measure.py's ``timed_generate``). The cache finds
  nothing; the figure is tok/s on vs off (the target: within 2%). Outputs must match
  between runs as well. Warm-up: 8 requests of the same mix, own seed.

Ratios are paired within a round (each round's on and off), then median/min/max over
rounds: ``ttft_p50_off_over_on``, ``total_tok_per_s_on_over_off`` (chat; targets on the
H200 >= 3 and >= 1.5) and ``miss_tok_per_s_on_over_off`` (target >= 0.98). The JSON
(``--json``, default bench/results/prefix-cache-<model>-<device>.json) holds the command,
the configuration (settings and engine info of each config), per-run figures, the summaries
and the ratios with whether each target is met. A short table prints last. Exit 1 when any
run's tokens differ from the first run's (the targets do not set the exit status).

``tiny-random`` is ``tiny_random_model(seed=0)`` with context ``--tiny-context``; with
``--device cuda`` it gets bench/throughput.py's TINY_CUDA_GEOMETRY (head_dim 64).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_json  # noqa: E402
from prefix_chat import add_chat_args, chat_figures, chat_run, conversations  # noqa: E402
from prefix_report import first_mismatch, paired, summarize, table  # noqa: E402
from throughput import DEFAULT_MODEL, TINY, TINY_CUDA_GEOMETRY, plain  # noqa: E402
from throughput_measure import Probe, graph_counters, timed_generate  # noqa: E402
from throughput_workload import WARMUP_REQUESTS, requests  # noqa: E402

from crucible import LLM, SamplingParams  # noqa: E402
from crucible.engine.settings import Settings  # noqa: E402
from crucible.model.loader import LoadedModel, load_model  # noqa: E402

CONFIGS = {"on": None, "off": 0}  # name -> Settings.prefix_cache_size
TARGETS = {"ttft_p50_off_over_on": 3.0, "total_tok_per_s_on_over_off": 1.5,
           "miss_tok_per_s_on_over_off": 0.98}


def load(args: argparse.Namespace) -> LoadedModel:
    if args.model == TINY:
        from crucible.model.tiny import tiny_random_model

        # The CUDA kernels take head_dim 64 only: on --device cuda the tiny model gets it.
        geometry = TINY_CUDA_GEOMETRY if args.device == "cuda" else {}
        return tiny_random_model(seed=0, weights=args.weights or "f32",
                                 max_context=args.tiny_context, **geometry)
    return load_model(args.model, args.weights or "int8")


def fresh_llm(model: LoadedModel, args: argparse.Namespace, cache_size: int | None) -> LLM:
    given = {k: getattr(args, k) for k in ("num_pages", "token_budget", "max_running")
             if getattr(args, k) is not None}
    # from_env: CRUCIBLE_* switches (late planning, the GEMM order) reach the engines, so
    # bench/env_ab.py can A/B them; cache_size None means "not given": the cache is on.
    settings = Settings.from_env(device=args.device, weights=model.weights_mode,
                                 prefix_cache_size=cache_size,
                                 max_queue=max(Settings.max_queue, args.users), **given)
    return LLM(model, settings=settings)


def collect() -> None:
    """Once the last LLM is dropped: collect it before the next is built, so on CUDA its
    pool is free to size the next one's."""
    gc.collect()


# -- chat ------------------------------------------------------------------------------

def chat_once(model: LoadedModel, args: argparse.Namespace, name: str,
              work: tuple[list[int], list[list[list[int]]]],
              warm: list[tuple[list[int], list[list[list[int]]]]]
              ) -> tuple[dict[str, Any], list[list[int]], LLM]:
    params = SamplingParams(max_tokens=args.reply_tokens, temperature=0, ignore_eos=True)
    llm = fresh_llm(model, args, CONFIGS[name])
    for system, msgs in warm:
        asyncio.run(chat_run(llm, system, msgs, params))
    c0 = llm.engine.cache_stats()
    s0, g0 = llm.stats(), graph_counters(llm)
    wall, recs = asyncio.run(chat_run(llm, *work, params))
    fig = chat_figures(wall, recs, c0, llm.engine.cache_stats())
    s1, g1 = llm.stats(), graph_counters(llm)
    fig["steps"] = s1["steps"] - s0["steps"]
    fig["preemptions"] = s1["preemptions"] - s0["preemptions"]
    # Captures inside the timed part (a graph per new step shape) cost TTFT: count them.
    fig["graphs"] = {k: g1[k] - g0.get(k, 0) for k in g1}
    return fig, [r["reply"] for r in recs], llm


# -- miss ------------------------------------------------------------------------------

def miss_once(model: LoadedModel, args: argparse.Namespace, name: str, work: tuple,
              warm: tuple) -> tuple[dict[str, Any], list[list[int]], LLM]:
    llm = fresh_llm(model, args, CONFIGS[name])
    probe = Probe(llm)
    try:
        timed_generate(llm, probe, *warm)
        c0 = llm.engine.cache_stats()
        res = timed_generate(llm, probe, *work)
        c1 = llm.engine.cache_stats()
    finally:
        probe.close()
    res.pop("_samples")
    outs = res.pop("_outs")
    keep = ("wall_s", "requests", "prompt_tokens", "output_tokens", "total_tok_per_s",
            "output_tok_per_s", "steps", "mean_rows_per_step", "preemptions",
            "chained_steps", "not_length_finish", "step_call_wall_ms", "graphs")
    fig = {k: res[k] for k in keep if k in res}
    fig["cache"] = {k: c1[k] - c0[k] for k in c1 if k != "cache_pages"}
    return fig, [list(o.token_ids) for o in outs], llm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("chat", "miss", "both"), default="both")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help=f"a model name or path; {TINY!r}: tiny_random_model(seed=0)")
    ap.add_argument("--tiny-context", type=int, default=8192, help="tiny-random's context")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--weights", choices=("int8", "f32"),
                    help="default: int8; tiny-random: f32")
    ap.add_argument("--num-pages", type=int, help="default: the library's pool sizing")
    ap.add_argument("--token-budget", type=int)
    ap.add_argument("--max-running", type=int)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    add_chat_args(ap)
    ap.add_argument("--warmup-turns", type=int, default=None,
                    help="chat warm-up turns per fresh LLM (other prompts; 0: none; "
                         "default: --turns)")
    ap.add_argument("--warmup-passes", type=int, default=1,
                    help="chat warm-up conversation sets, each with its own prompts: a mixed "
                         "graph is captured the second time its key is seen, so one pass can "
                         "leave keys to be captured inside the timed turns")
    ap.add_argument("--miss-requests", type=int, default=256)
    ap.add_argument("--miss-prompt-min", type=int, default=256)
    ap.add_argument("--miss-prompt-max", type=int, default=1024)
    ap.add_argument("--miss-output", type=int, default=64)
    ap.add_argument("--json", help="default: bench/results/prefix-cache-<model>-<device>.json")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.users < 1 or args.turns < 1 or args.reply_tokens < 1:
        ap.error("--rounds, --users, --turns and --reply-tokens must be >= 1")
    if args.warmup_turns is None:
        args.warmup_turns = args.turns
    if args.warmup_turns < 0 or args.warmup_passes < 1:
        ap.error("--warmup-turns must be >= 0 and --warmup-passes >= 1")
    if not 1 <= args.user_min <= args.user_max:
        ap.error("need 1 <= --user-min <= --user-max")
    if not 1 <= args.miss_prompt_min <= args.miss_prompt_max or args.miss_output < 1:
        ap.error("need 1 <= --miss-prompt-min <= --miss-prompt-max and --miss-output >= 1")
    workloads = ("chat", "miss") if args.workload == "both" else (args.workload,)

    t_load = time.perf_counter()
    model = load(args)
    load_s = time.perf_counter() - t_load
    context = model.config.max_context
    longest = args.system_tokens + args.turns * (args.user_max + args.reply_tokens)
    if "chat" in workloads and longest > context:
        ap.error(f"a conversation may reach {longest} tokens, over the context {context}")
    if "miss" in workloads and args.miss_prompt_max + args.miss_output > context:
        ap.error(f"miss requests may reach {args.miss_prompt_max + args.miss_output} "
                 f"tokens, over the context {context}")
    stops = set(model.tokenizer.stop_token_ids)
    ids = [t for t in range(model.config.vocab_size) if t not in stops]
    chat_work = conversations(args, ids, args.seed, args.turns)
    chat_warm = [conversations(args, ids, args.seed + 1_000_003 * (p + 1), args.warmup_turns)
                 for p in range(args.warmup_passes if args.warmup_turns else 0)]
    bounds = (args.miss_prompt_min, args.miss_prompt_max, args.miss_output, args.miss_output)
    _, _, mp, mpar = requests("random", args.miss_requests, bounds, context, ids,
                              random.Random(args.seed + 7), 0.0)
    _, _, wp, wpar = requests("random", WARMUP_REQUESTS, bounds, context, ids,
                              random.Random(args.seed + 2_000_003), 0.0)
    miss_work, miss_warm = (mp, mpar), (wp, wpar)
    print(f"model={model.name} weights={model.weights_mode} context={context} "
          f"load_s={load_s:.2f} workloads={','.join(workloads)} rounds={args.rounds}",
          flush=True)

    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    refs: dict[str, list[list[int]]] = {}
    mismatches: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    engines: dict[str, Any] = {}
    for r in range(args.rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        for w in workloads:
            for name in order:
                once = chat_once if w == "chat" else miss_once
                work, warm = (chat_work, chat_warm) if w == "chat" else (miss_work, miss_warm)
                fig, toks, llm = once(model, args, name, work, warm)
                engines.setdefault(name, {"settings": plain(llm.settings),
                                          "engine_info": plain(llm.info),
                                          "device": llm.engine.runner.device})
                del llm
                collect()
                if w not in refs:
                    refs[w] = toks
                    same = None
                else:
                    same = first_mismatch(refs[w], toks)
                    if same is not None:
                        mismatches[w].append({"round": r, "config": name, **same})
                runs[w].append({"round": r, "config": name, "identical_to_first": same is None,
                                "figures": fig})
                extra = (f"TTFT p50 {fig['ttft_p50_ms']:.1f} ms p99 {fig['ttft_p99_ms']:.1f} "
                         f"ms, hit {fig['cache_hit_share']:.1%}, " if w == "chat" else "")
                print(f"round {r} {w} cache {name}: {fig['wall_s']} s, {extra}"
                      f"{fig['total_tok_per_s']} tok/s, {fig['output_tok_per_s']} out tok/s, "
                      f"identical={same is None}", flush=True)

    ratios: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    if "chat" in runs:
        summary["chat"] = summarize(runs["chat"], (
            "wall_s", "ttft_p50_ms", "ttft_p99_ms", "total_tok_per_s", "output_tok_per_s",
            "cache_hit_share"), tuple(CONFIGS))
        ratios["ttft_p50_off_over_on"] = paired(runs["chat"], "ttft_p50_ms", "off", "on")
        ratios["ttft_p99_off_over_on"] = paired(runs["chat"], "ttft_p99_ms", "off", "on")
        ratios["total_tok_per_s_on_over_off"] = paired(runs["chat"], "total_tok_per_s",
                                                       "on", "off")
    if "miss" in runs:
        summary["miss"] = summarize(runs["miss"], ("wall_s", "total_tok_per_s",
                                                   "output_tok_per_s"), tuple(CONFIGS))
        ratios["miss_tok_per_s_on_over_off"] = paired(runs["miss"], "total_tok_per_s",
                                                      "on", "off")
    for k, target in TARGETS.items():
        if k in ratios:
            ratios[k]["target"] = target
            ratios[k]["median_meets_target"] = ratios[k]["median"] >= target

    device = next(iter(engines.values()))["device"]
    tag = "tiny" if args.model == TINY else Path(args.model).stem
    json_path = Path(args.json) if args.json else (
        Path(__file__).resolve().parent / "results" / f"prefix-cache-{tag}-{device}.json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "bench": "prefix_cache",
        "command": "python3 bench/prefix_cache_bench.py " + shlex.join(
            sys.argv[1:] if argv is None else argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "config": {"model": model.name, "weights": model.weights_mode, "device": device,
                   "context": context, "load_s": round(load_s, 3), "rounds": args.rounds,
                   "seed": args.seed, "order": "round r: on, off when r is even, else off, on",
                   "chat": {"users": args.users, "turns": args.turns,
                            "system_tokens": args.system_tokens,
                            "user_tokens": [args.user_min, args.user_max],
                            "reply_tokens": args.reply_tokens, "temperature": 0,
                            "warmup_turns": args.warmup_turns,
                            "warmup_passes": args.warmup_passes,
                            "longest_prompt": max(len(chat_work[0]) + sum(
                                len(m) for m in ms) + (args.turns - 1) * args.reply_tokens
                                for ms in chat_work[1])} if "chat" in runs else None,
                   "miss": {"requests": args.miss_requests,
                            "prompt_tokens": [args.miss_prompt_min, args.miss_prompt_max],
                            "output_tokens": args.miss_output, "temperature": 0,
                            "warmup_requests": WARMUP_REQUESTS} if "miss" in runs else None,
                   "configs": engines},
        "runs": runs,
        "summary": summary,
        "ratios": ratios,
        "exact": {w: not mismatches[w] for w in workloads},
        "mismatches": mismatches,
    }
    write_json(str(json_path), result)
    table(result)
    return 1 if any(mismatches.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
