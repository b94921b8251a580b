"""Offline throughput: N requests packed into shared steps vs the same requests one at a time.

    python bench/offline_throughput.py --model tiny --rounds 5
    python bench/offline_throughput.py --model default --rounds 1

Workload: ``--requests`` prompts (default 32) of random token ids, lengths uniform in
[64, 256], greedy, exactly ``--output`` (default 32) generated tokens each (ignore_eos).
Each round times both modes on one LLM, alternating which goes first; a warm-up generate
runs before any timing. Reported: tokens/s (prompt + generated, and generated only) per
mode as min-max over rounds, the per-round packed/one-at-a-time ratio (min-max), and
whether both modes produced identical tokens. Results are appended to
bench/results/offline_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crucible import LLM, SamplingParams  # noqa: E402


def make_llm(name: str, budget: int) -> LLM:
    if name == "tiny":
        from crucible.model.tiny import tiny_random_model

        # A bigger tiny model than the tests use, so a step is mostly model work.
        model = tiny_random_model(0, weights="f32", hidden_size=256, n_layers=4, n_heads=8,
                                  n_kv_heads=2, head_dim=32, ffn_size=768, tie_embeddings=False)
        return LLM(model, weights="f32", token_budget=budget, num_pages=1024)
    return LLM(None if name == "default" else name, token_budget=budget, num_pages=1024)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny | default | a model path/name")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "offline_throughput.json"))
    args = ap.parse_args()

    llm = make_llm(args.model, args.token_budget)
    vocab = llm.model.config.vocab_size
    rnd = random.Random(args.seed)
    special = set(llm.tokenizer.stop_token_ids)
    normal = [t for t in range(min(vocab, 256 if args.model == "tiny" else vocab)) if t not in special]
    prompts = [[rnd.choice(normal) for _ in range(rnd.randint(64, 256))]
               for _ in range(args.requests)]
    params = SamplingParams(temperature=0, max_tokens=args.output, ignore_eos=True)
    n_prompt = sum(map(len, prompts))
    n_out = args.requests * args.output
    print(f"model={llm.model.name} weights={llm.model.weights_mode} requests={args.requests} "
          f"prompt_tokens={n_prompt} output_tokens={n_out} budget={args.token_budget} "
          f"rounds={args.rounds} cpus={os.cpu_count()}", flush=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up

    def packed():
        return [o.token_ids for o in llm.generate(prompts, params)]

    def single():
        return [llm.generate([p], params)[0].token_ids for p in prompts]

    rounds = []
    identical = True
    for r in range(args.rounds):
        order = [("packed", packed), ("single", single)]
        if r % 2:
            order.reverse()
        res = {}
        for name, fn in order:
            steps0 = llm.stats()["steps"]
            secs, toks = timed(fn)
            res[name] = {"seconds": secs, "steps": llm.stats()["steps"] - steps0, "tokens": toks}
        identical &= res["packed"]["tokens"] == res["single"]["tokens"]
        row = {k: {"seconds": round(v["seconds"], 4), "steps": v["steps"],
                   "tok_per_s": round((n_prompt + n_out) / v["seconds"], 2),
                   "out_tok_per_s": round(n_out / v["seconds"], 2)} for k, v in res.items()}
        row["ratio"] = round(res["single"]["seconds"] / res["packed"]["seconds"], 3)
        row["first"] = order[0][0]
        rounds.append(row)
        print(f"round {r}: packed {row['packed']['tok_per_s']} tok/s "
              f"({row['packed']['steps']} steps), one-at-a-time {row['single']['tok_per_s']} "
              f"tok/s ({row['single']['steps']} steps), ratio {row['ratio']}x", flush=True)

    def span(key, sub=None):
        vals = [r[key][sub] if sub else r[key] for r in rounds]
        return [min(vals), max(vals)]

    summary = {
        "bench": "offline_throughput", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": llm.model.name, "weights": llm.model.weights_mode, "device": "cpu",
        "host": platform.machine(), "cpus": os.cpu_count(), "requests": args.requests,
        "prompt_tokens": n_prompt, "output_tokens": n_out, "token_budget": args.token_budget,
        "rounds": rounds, "packed_tok_per_s": span("packed", "tok_per_s"),
        "single_tok_per_s": span("single", "tok_per_s"), "ratio": span("ratio"),
        "identical_tokens": identical,
        "command": "python bench/offline_throughput.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps({k: summary[k] for k in ("packed_tok_per_s", "single_tok_per_s", "ratio",
                                              "identical_tokens")}))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text()) if out.exists() else []
    runs.append(summary)
    out.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
