"""Attention's segment lists longest history first (backend/cupy_meta.py, the default: a
step's decode rows by history, a mixed step's slices by causal end) against the lists as
the step gives them, in graph replays on the GPU (random weights of the default
model's shapes, so no model file is needed).

    python3 bench/decode_order.py [--rounds 3] [--replays 20] [--json PATH]

Cases: attention_fork.py's chat steps (mixed graphs: cohorts, joiners, ~250 decode rows
beside ~600 prompt tokens) and decode steps (decode graphs) whose rows' histories spread
as a chat server's do, or do not. mixed_step.make_batch draws each row's history at
random, so "listed" is arrival order. The order is read when a replay's metadata is
built, so one captured graph serves both rules; the rules alternate by round and the ratio
is longest-first over listed per round. Both must give the same logits bit for bit, every
round (the order moves no arithmetic).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
from attention_fork import CASES as MIXED_CASES
from capacity_classes import chat_steps, timed_replays
from common import stat, write_json
from mixed_step import make_batch

# (name, decode rows, their history range)
DECODE_CASES = (("decode 256 at 300-2,500", 256, (300, 2500)),
                ("decode 128 at 300-2,500", 128, (300, 2500)),
                ("decode 64 at 300-2,500", 64, (300, 2500)),
                ("decode 256 at 400-1,200", 256, (400, 1200)),
                ("decode 64 at 128-192", 64, (128, 192)))
RULES = ("listed", "longest")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", default="bench/decode-order.json")
    args = p.parse_args(argv)
    runner, batches = chat_steps(MIXED_CASES)
    be = runner.backend
    rng = np.random.default_rng(2)
    counts = {}
    for name in batches:
        counts[name] = lambda: be.mixed_graphs.num_replays
    for name, rows, hist in DECODE_CASES:
        batches[name] = make_batch(rng, rows, hist, (), runner.config.vocab_size, pages=176)
        counts[name] = lambda: be.graphs.num_replays
    res: dict[str, dict[str, list[float]]] = {}
    opts = be.options
    try:
        for r in range(args.rounds):
            for name, batch in batches.items():
                got, d = {}, res.setdefault(name, {})
                for rule in RULES if r % 2 == 0 else RULES[::-1]:
                    be.options = dataclasses.replace(opts, longest_first=rule == "longest")
                    ms, logits = timed_replays(lambda b=batch: runner.forward_device(b),
                                               args.replays, counts[name])
                    got[rule] = logits.view(np.uint32).tobytes()
                    d.setdefault(rule + "_ms", []).append(ms)
                if len(set(got.values())) != 1:
                    raise SystemExit(f"{name}: the orders' logits differ")
                d.setdefault("longest_over_listed", []).append(
                    d["longest_ms"][-1] / d["listed_ms"][-1])
            print(f"round {r} done", file=sys.stderr, flush=True)
    finally:
        be.options = opts
    summary = {n: {k: stat(v) for k, v in d.items()} for n, d in res.items()}
    for n, d in summary.items():
        f = d["longest_over_listed"]
        print(f"{n}: listed {d['listed_ms']['median']:.2f} ms, longest first "
              f"x{f['median']:.3f} [{f['min']:.3f}-{f['max']:.3f}]", file=sys.stderr)
    write_json(args.json, {"command": "python3 bench/decode_order.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                           "logits_identical": True, "results": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
