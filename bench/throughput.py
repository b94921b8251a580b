"""Offline throughput in the shape of vLLM's benchmark: every request handed to one generate.

    python bench/throughput.py                                   # default model, random mix
    python bench/throughput.py --workload chat --rounds 3
    python bench/throughput.py --model tiny-random --device cpu --requests 256 \\
        --prompt-min 16 --prompt-max 95 --output-min 32 --output-max 95 --num-pages 4096

Workloads (``--workload``: ``random``, vLLM's; ``chat``, a chat-like mix) are
bench/throughput_workload.py's, the timing wrappers and per-step stats
bench/throughput_measure.py's and the exactness probes bench/throughput_probes.py's (each
file's docstring says how). ``tiny-random`` is ``tiny_random_model(seed=0)`` (context
``--tiny-context``, 512); with ``--device cuda`` it gets head_dim 64 (TINY_CUDA_GEOMETRY),
the only one the CUDA kernels take.

A warm-up of 8 requests of the same mix (own seed) runs first, untimed, its captures
reported apart; then each of ``--rounds`` rounds times one ``llm.generate`` of the whole
workload on the same LLM.

The running-requests histogram bins the timed calls by running requests; its tok/s is rows
over wall time per bin (bench/throughput_plot.py, which also draws the PNG: matplotlib
when it imports, else serve_plot's stdlib rasterizer). The JSON (``--json``, default
bench/results/throughput-<model>-<device>-<workload>.json) holds the command line, the
configuration with the LLM's settings, per-round figures and their median/min/max, the
per-step stats (mean, p50, p99) and the histogram. A short table prints last.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from common import stat, write_json  # noqa: E402
from throughput_measure import Probe, graph_counters, timed_generate  # noqa: E402
from throughput_plot import bin_by_running, draw  # noqa: E402
from throughput_probes import PROBE_LOGPROBS, first_difference, plan_probes  # noqa: E402
from throughput_workload import CHAT_SHAPE, MIXES, WARMUP_REQUESTS, requests  # noqa: E402

from crucible import LLM  # noqa: E402

DEFAULT_MODEL = "smollm2-135m-instruct"  # crucible.model.fetch.DEFAULT_MODEL
TINY = "tiny-random"
TINY_CUDA_GEOMETRY = dict(hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_size=512)


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


ROUND_FIGURES = ("wall_s", "total_tok_per_s", "output_tok_per_s", "req_per_s", "steps",
                 "mean_rows_per_step", "preemptions", "chained_steps", "chained_mixed_steps",
                 "graph_replays", "eager_steps", "captures_in_timed_run")


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
    sizes, clipped, prompts, params = requests(args.workload, args.requests, bounds, context,
                                               ids, random.Random(args.seed), args.temperature)
    # control: the probe whose alone run gets another seed (--probe-negative-control)
    probe_idx, alone_params, control = plan_probes(sizes, params, args.probes,
                                                   args.temperature, args.probe_negative_control)
    _, _, wprompts, wparams = requests(args.workload, WARMUP_REQUESTS, bounds, context, ids,
                                       random.Random(args.seed + 1_000_003), args.temperature)
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
