"""``llm-engine gpu-eval``: cross-entropy and perplexity on held-out English text.

The text, ``crucible/data/heldout_en.txt``, was written for this project by its developers.
It is original prose, under the project's licence (Apache-2.0), so no model has trained on
it. It is cut into non-overlapping windows of ``--ctx`` tokens. Each window is one
prefill with logits for every row, and each row's log-probability of the next token is
summed in float64.

``--compare-attn V`` evaluates a second time with attention variant V and reports both
cross-entropies and whether the logits are bit-identical (exact variants must be).
``--paged`` evaluates a second time with the window's pages shuffled across the pool and
reports whether anything changed. Works on any device; figures are meant for the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from typing import Any

import numpy as np

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.runner import ModelRunner
from crucible.arg_types import non_negative_int, positive_int


def heldout_text() -> str:
    return resources.files("crucible.data").joinpath("heldout_en.txt").read_text()


def evaluate(runner: ModelRunner, tokens: list[int], ctx: int, shuffle: bool,
             rng: np.random.Generator) -> tuple[float, int, list[np.ndarray]]:
    """(summed negative log-likelihood, predicted tokens, per-window logits)."""
    nll, count, kept = 0.0, 0, []
    for start in range(0, len(tokens) - 1, ctx):
        window = tokens[start : start + ctx + 1]
        inputs, targets = window[:-1], np.asarray(window[1:])
        n_pages = -(-len(inputs) // 16)
        pages = (rng.permutation(runner.num_pages)[:n_pages] if shuffle
                 else np.arange(n_pages)).tolist()
        logits = runner.forward(build_packed_batch(
            [SegmentSpec("eval", inputs, 0, pages, list(range(len(inputs))))]))
        x = logits.astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        logp = x[np.arange(len(targets)), targets] - np.log(np.exp(x).sum(axis=1))
        nll -= float(logp.sum())
        count += len(targets)
        kept.append(logits)
    return nll, count, kept


def main(argv: list[str]) -> int:
    from crucible.engine.settings import Settings
    from crucible.model.loader import load_model

    p = argparse.ArgumentParser(prog="llm-engine gpu-eval")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--weights", choices=("int8", "f32"), default="int8")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--tokens", type=non_negative_int, default=0, help="evaluate at most this many (0: all)")
    p.add_argument("--ctx", type=positive_int, default=512, help="window length in tokens")
    p.add_argument("--paged", action="store_true", help="also evaluate on shuffled pages")
    p.add_argument("--compare-attn", default=None, help="also evaluate with this variant")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    model = load_model(args.model, args.weights)
    if not 1 <= args.ctx <= model.config.max_context:
        print(f"gpu-eval: --ctx must be in [1, {model.config.max_context}]", file=sys.stderr)
        return 2
    tokens = model.tokenizer.encode(heldout_text())
    if args.tokens:
        tokens = tokens[: args.tokens + 1]
    pages = -(-args.ctx // 16) * 4
    runs: dict[str, Any] = {}
    env = Settings.from_env()  # the attention variant and the GEMM order (CRUCIBLE_GEMM)
    selected = env.attention
    plan = [("selected", selected, False)]
    if args.paged:
        plan.append(("shuffled pages", selected, True))
    if args.compare_attn:
        plan.append((f"attention {args.compare_attn}", args.compare_attn, False))
    base = None
    for label, variant, shuffle in plan:
        runner = ModelRunner(model, num_pages=pages, device=args.device, attention=variant,
                             settings=env)
        t0 = time.perf_counter()
        nll, count, logits = evaluate(runner, tokens, args.ctx, shuffle,
                                      np.random.default_rng(0))
        ce = nll / count
        row = {"attention": variant, "shuffled_pages": shuffle, "tokens": count,
               "cross_entropy": ce, "perplexity": float(np.exp(ce)),
               "seconds": time.perf_counter() - t0}
        if base is None:
            base = logits
        else:
            row["bit_identical_to_selected"] = all(np.array_equal(a, b)
                                                   for a, b in zip(base, logits))
            row["max_abs_logit_diff"] = max(float(np.abs(a - b).max())
                                            for a, b in zip(base, logits))
        runs[label] = row
        print(f"{label:>24}: {variant:<16} CE {ce:.6f}  PPL {np.exp(ce):.4f}  over {count} "
              f"tokens" + (f"  identical={row['bit_identical_to_selected']}"
                           if "bit_identical_to_selected" in row else ""))
    out = {"command": "llm-engine gpu-eval " + " ".join(argv), "model": args.model,
           "weights": args.weights, "device": runner.device, "ctx": args.ctx, "runs": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0
