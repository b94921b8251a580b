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

import numpy as np
from capacity_classes import chat_steps
from mixed_step import make_batch
from option_ab import option_ab, write

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
    g = runner.backend.graphs
    rng = np.random.default_rng(2)
    cases = {name: (make_batch(rng, rows, hist, (), runner.config.vocab_size, pages=176),
                    lambda: g.num_replays) for name, rows, hist in DECODE_CASES}
    # The order is read when a replay's metadata is built: one graph serves both settings.
    summary = option_ab(runner, cases, "longest_first", RULES, args.rounds, args.replays)
    write("decode_order.py", argv, args.json, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
