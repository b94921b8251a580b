"""Batch-1 greedy decode speed, one figure per process, for A/B runs of two trees.

    python3 bench/b1_decode.py TAG fma|mma                  # random weights, the runner
    python3 bench/b1_decode.py TAG fma|mma --model PATH     # a model, through LLMEngine

Without ``--model``: random int8 weights of the default model's shapes (bench/common.py),
decode steps queued pipelined on the runner with decode graphs and PDL (gpu_generate.py's
``decode_rate``, 120 steps after a 128-token prompt), four rates. With ``--model``: the
engine's rate (gpu_generate.py's ``engine_rate``: 128-token prompt, 256 new tokens, the
second of two runs), three rates. Prints one ``RESULT {json}`` line. An A/B runs this in a
fresh process per tree (PYTHONPATH=<tree>), the trees alternating; each process compiles
and captures its own kernels and graphs, and only the timed steps count.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from common import SMOLLM2
from gpu_generate import decode_rate, engine_rate, set_mode

from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tag")
    p.add_argument("gemm", choices=("fma", "mma"))
    p.add_argument("--model", default=None)
    p.add_argument("--steps", type=int, default=120, help="runner mode: steps a rate")
    args = p.parse_args(argv)
    if not 1 <= args.steps <= 125:  # decode_rate's rows hold 16 pages: positions 130..255
        p.error(f"--steps must be in 1..125, got {args.steps}")
    if args.model:
        from crucible.model.loader import load_model

        model = load_model(args.model, "int8")
    else:
        from crucible.model.tiny import tiny_random_model

        model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    runner = ModelRunner(model, num_pages=1100, device="cuda",
                         settings=Settings(device="cuda", gemm=args.gemm))
    rng = np.random.default_rng(0)
    if args.model:
        rates = [engine_rate(runner, model.tokenizer, 1, 256, rng) for _ in range(3)]
    else:
        set_mode(runner, "graph_pdl_pipe", runner.backend.graphs)
        rates = [decode_rate(runner, 1, args.steps, rng, True) for _ in range(4)]
    print("RESULT " + json.dumps({"tag": args.tag, "gemm": args.gemm, "rates": rates}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
