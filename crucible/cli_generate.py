"""``llm-engine generate`` and ``llm-engine chat``: stream text from the engine."""

from __future__ import annotations

import argparse
import sys
import time

from crucible.cli_args import add_model_options, add_sampling_options
from crucible.engine.engine import LLMEngine
from crucible.engine.pages import pages_for
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig


def build_engine(args: argparse.Namespace) -> LLMEngine:
    from crucible.backend.select import resolve_device
    from crucible.model.loader import load_model
    from crucible.model.runner import ModelRunner

    from crucible.kernels.variants import variant_from_env

    variant_from_env()  # fail fast on bad settings, before a slow model load
    device = resolve_device(args.device)
    model = load_model(args.model, args.weights)
    pages = args.num_pages or 2 * pages_for(model.config.max_context)
    runner = ModelRunner(model, num_pages=pages, device=device)
    variant = getattr(runner.backend, "variant", None)
    if variant is not None:  # the GPU path: say which attention kernel runs
        from crucible.kernels.variants import startup_report

        print(f"crucible: {startup_report(variant)}", file=sys.stderr)
    config = SchedulerConfig(token_budget=args.token_budget, chunk_cap=args.chunk_cap)
    if not getattr(args, "profile", False):
        return LLMEngine(runner, model.tokenizer, config)
    from crucible.backend.profile import ProfiledBackend, ProfiledSampler

    runner.backend = pb = ProfiledBackend(runner.backend)
    engine = LLMEngine(runner, model.tokenizer, config)
    if runner.sampler is not None:
        runner.sampler = ProfiledSampler(runner.sampler, pb)
    else:
        engine.stage_timer = pb.timed
    return engine


def profile_line(engine: LLMEngine) -> str | None:
    """Per-stage milliseconds summed over the run's steps and layers (with --profile)."""
    be = engine.runner.backend
    if not hasattr(be, "stage_ms"):
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
           out=sys.stdout) -> dict[str, float]:
    """Run one request to the end, writing text as it comes; return timing stats."""
    t0 = time.perf_counter()
    rid = engine.add_request(prompt_ids, params)
    first = last = None
    n_out = 0
    reason = None
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
                if delta.finished:
                    reason = delta.finish_reason
    except KeyboardInterrupt:
        engine.abort(rid)
        raise
    ttft = (first or time.perf_counter()) - t0
    decode = (n_out - 1) / (last - first) if n_out > 1 and last > first else 0.0
    return {"prompt_tokens": len(prompt_ids), "generated_tokens": n_out, "ttft_s": ttft,
            "decode_tok_s": decode, "finish_reason": reason}


def stats_line(stats: dict, engine: LLMEngine) -> str:
    runner = engine.runner
    return (f"[prompt {stats['prompt_tokens']} tok | generated {stats['generated_tokens']} tok "
            f"({stats['finish_reason']}) | ttft {stats['ttft_s'] * 1000:.0f} ms | decode "
            f"{stats['decode_tok_s']:.1f} tok/s | device {runner.device} | weights "
            f"{runner.model.weights_mode}]")


def generate_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine generate", description="Generate text.")
    p.add_argument("--prompt", required=True, help="the prompt text ('-' reads stdin)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user turn in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--profile", action="store_true",
                   help="time each forward stage (runs eagerly: no decode graphs)")
    add_sampling_options(p, max_tokens=128)
    add_model_options(p)
    args = p.parse_args(argv)
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
    if (line := profile_line(engine)) is not None:
        print(line, file=sys.stderr)
    return 0


def chat_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine chat", description="Chat in the terminal. "
                                "Empty line or Ctrl-D quits; /reset starts over.")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--stats", action="store_true", help="print a stats line after each answer")
    add_sampling_options(p, max_tokens=512)
    add_model_options(p)
    args = p.parse_args(argv)
    engine = build_engine(args)
    tok = engine.tokenizer
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    base = list(history)
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if not line:
            return 0
        if line == "/reset":
            history = list(base)
            continue
        history.append({"role": "user", "content": line})
        sys.stdout.write("assistant> ")
        collected: list[str] = []

        class Tee:
            def write(self, text: str) -> None:
                collected.append(text)
                sys.stdout.write(text)

            def flush(self) -> None:
                sys.stdout.flush()

        try:
            stats = stream(engine, tok.encode_chat(history), sampling_from_args(args), Tee())
        except KeyboardInterrupt:
            print("\n[stopped]")
            history.pop()
            continue
        print()
        history.append({"role": "assistant", "content": "".join(collected)})
        if args.stats:
            print(stats_line(stats, engine), file=sys.stderr)
