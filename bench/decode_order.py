"""The decode graphs' rows longest history first (backend/cupy_meta.py, the default) against
the rows as the step lists them, in decode-graph replays on the GPU (random weights of the
default model's shapes, so no model file is needed).

    python3 bench/decode_order.py [--rounds 3] [--replays 20] [--json PATH]

Cases: decode steps whose rows' histories spread as a chat server's do (300-2,500
positions), or less, or not at all (#15's batch-64 figure: 128-192). mixed_step.make_batch
draws each row's history at random, so "listed" is arrival order. The order is read when a
replay's metadata is built, so one captured graph serves both rules; the rules alternate by
round and the ratio is longest-first over listed per round. Both must give the same logits
bit for bit, every round (the order moves no arithmetic; the pool here is mostly zeros, so
tests/test_gpu_decode_order.py makes the bitwise claim over random K/V).

bench/decode-order-h100.json was taken at edf2e7f, when mixed steps were reordered too; its
mixed cases are kept for the record (0.97-1.02x: no gain, and mixed steps now keep their
order).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
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
    runner, _ = chat_steps(())
    be = runner.backend
    rng = np.random.default_rng(2)
    batches = {name: make_batch(rng, rows, hist, (), runner.config.vocab_size, pages=176)
               for name, rows, hist in DECODE_CASES}
    res: dict[str, dict[str, list[float]]] = {}
    opts = be.options
    try:
        for r in range(args.rounds):
            for name, batch in batches.items():
                got, d = {}, res.setdefault(name, {})
                for rule in RULES if r % 2 == 0 else RULES[::-1]:
                    be.options = dataclasses.replace(opts, longest_first=rule == "longest")
                    ms, logits = timed_replays(lambda b=batch: runner.forward_device(b),
                                               args.replays, lambda: be.graphs.num_replays)
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
