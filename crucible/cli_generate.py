"""``llm-engine generate``: stream text from the engine (the chat, crucible/chat/, shares
build_engine, sampling_from_args and stats_line)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from crucible.backend.profile import ProfiledBackend
from crucible.cli_args import Parser, add_model_options, add_sampling_options, pool_flags
from crucible.engine import factory
from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.settings import Settings
from crucible.kernels.variants import parse_variant, startup_report

# The start-up line naming the int8 GEMMs' order (f32 weights take linear.cu's too).
GEMM_REPORT = {"mma": "GEMMs on the tensor cores (gemm mma; --gemm fma gives the CPU "
                      "backend's bits)",
               "fma": "GEMMs on the CUDA cores (gemm fma: linear.cu's order, the CPU's bits)"}


def build_engine(args: argparse.Namespace) -> LLMEngine:
    """The flags over the environment's settings, through the one engine factory."""
    settings = Settings.from_env(device=args.device, weights=args.weights, gemm=args.gemm,
                                 mixed_graph_rows=args.mixed_graph_rows, **pool_flags(args))
    engine, info = factory.build_engine(args.model, settings)
    factory.freeze_startup()
    print(f"crucible: {info.pool}", file=sys.stderr)
    if info.note:
        print(f"crucible: {info.note}", file=sys.stderr)
    if info.graphs:
        print(f"crucible: {info.graphs}", file=sys.stderr)
    if info.device == "cuda":  # say which attention kernel runs
        print(f"crucible: {startup_report(parse_variant(info.attention))}", file=sys.stderr)
        print(f"crucible: {GEMM_REPORT[info.gemm]}", file=sys.stderr)
    if not args.profile:
        return engine
    from crucible.backend.profile import ProfiledSampler

    runner = engine.runner
    runner.backend = pb = ProfiledBackend(runner.backend)
    if runner.sampler is not None:
        runner.sampler = ProfiledSampler(runner.sampler, pb)
    else:
        engine.stage_timer = pb.timed
    return engine


def profile_line(engine: LLMEngine) -> str | None:
    """Per-stage milliseconds summed over the run's steps and layers (with --profile)."""
    be = engine.runner.backend
    if not isinstance(be, ProfiledBackend):
        return None
    ms = be.stage_ms()
    kind = "GPU kernel" if be.gpu else "wall"
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1]))
    return f"[profile ({kind} ms, {engine.num_steps} steps, eager): total {sum(ms.values()):.2f}: {parts}]"


def sampling_from_args(args: argparse.Namespace, stop_ids: tuple[int, ...] = ()) -> SamplingParams:
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed,
                          stop_token_ids=stop_ids)


def stream(engine: LLMEngine, prompt_ids: list[int], params: SamplingParams,
           out: TextIO | None = None) -> dict[str, float]:
    """Run one request to the end, writing text as it comes (to ``out``, default the
    current sys.stdout: a default bound at import kept whatever stream was there then);
    return timing stats."""
    out = sys.stdout if out is None else out
    t0 = time.perf_counter()
    rid = engine.add_request(prompt_ids, params)
    first = last = None
    n_out = 0
    reason = None
    cached = 0
    try:
        while engine.has_unfinished():
            for delta in engine.step():
                if delta.request_id != rid:
                    continue
                if delta.new_token_ids:
                    last = time.perf_counter()
                    first = first or last
                    n_out += len(delta.new_token_ids)
                out.write(delta.new_text)
                out.flush()
                cached = delta.num_cached_tokens
                if delta.finished:
                    reason = delta.finish_reason
    except KeyboardInterrupt:
        engine.abort(rid)
        raise
    ttft = (first or time.perf_counter()) - t0
    # A rate needs two tokens: with 0 or 1 generated (or both in one step) there is none.
    decode = (n_out - 1) / (last - first) if n_out > 1 and last > first else None
    return {"prompt_tokens": len(prompt_ids), "generated_tokens": n_out, "ttft_s": ttft,
            "decode_tok_s": decode, "finish_reason": reason, "cached_tokens": cached}


def stats_line(stats: dict, engine: LLMEngine) -> str:
    """``decode - tok/s`` when there is no rate (fewer than two generated tokens)."""
    runner = engine.runner
    rate = stats["decode_tok_s"]
    decode = "-" if rate is None else f"{rate:.1f}"
    cached = f" ({stats['cached_tokens']} cached)" if stats.get("cached_tokens") else ""
    return (f"[prompt {stats['prompt_tokens']} tok{cached} | generated "
            f"{stats['generated_tokens']} tok "
            f"({stats['finish_reason']}) | ttft {stats['ttft_s'] * 1000:.0f} ms | decode "
            f"{decode} tok/s | device {runner.device} | weights {runner.model.weights_mode}]")


def counters_line(s: dict) -> str:
    """--stats: the engine's counters after the run, the prefix cache's among them."""
    return (f"[engine: {s['steps']} steps, {s['rows_computed']} rows, {s['preemptions']} "
            f"preemptions | prefix cache: {s['cache_hit_tokens']} cached tokens in "
            f"{s['cache_hits']} hits of {s['cache_queries']} queries, {s['cache_admissions']} "
            f"pages admitted, {s['cache_evictions']} evicted, {s['cache_pages']} resident "
            f"({s['cache_resident_bytes'] / 2 ** 20:.1f} MiB), {s['cache_fill_waits']} waits "
            f"for a prefix being filled]")


def generate_parser() -> argparse.ArgumentParser:
    p = Parser(prog="llm-engine generate", description="Generate text.")
    p.add_argument("--prompt", required=True, help="the prompt text ('-' reads stdin)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user turn in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--profile", action="store_true",
                   help="time each forward stage (runs eagerly: no decode graphs)")
    p.add_argument("--stats", action="store_true",
                   help="after the stats line, the engine's counters: steps, rows, "
                        "preemptions and the prefix cache's (cached tokens, hits, pages)")
    add_sampling_options(p, max_tokens=128)
    add_model_options(p)
    return p


def generate_main(argv: list[str]) -> int:
    args = generate_parser().parse_args(argv)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    engine = build_engine(args)
    tok = engine.tokenizer
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        ids = tok.encode_chat(messages)
    else:
        ids = tok.encode(prompt)
    stats = stream(engine, ids, sampling_from_args(args))
    print()
    print(stats_line(stats, engine), file=sys.stderr)
    if args.stats:
        print(counters_line(engine.stats()), file=sys.stderr)
    if (line := profile_line(engine)) is not None:
        print(line, file=sys.stderr)
    return 0
