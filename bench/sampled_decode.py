"""Engine decode tok/s, greedy against temperature sampling, at batch 1 and 64.

    python3 bench/sampled_decode.py --model PATH [--rounds 2] [--json PATH]

``gpu_generate.engine_rate`` (LLMEngine on a CUDA runner: scheduler, device sampling,
pipelining; the second of two identical runs is timed) with random 128-token prompts,
greedy, T = 0.7 and T = 1.0 in turn; batch 1 runs 256 steps, batch 64 128. Random prompts
make the model's next-token distributions flat, so sampled rows often draw past the first
256 candidates: the sampler's slow routes. For an A/B of two trees, run it under each
tree's PYTHONPATH in turn.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import stat, write_json
from gpu_generate import engine_rate

from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.loader import load_model

SAMPLING = (("greedy", {}), ("t07", {"temperature": 0.7}), ("t10", {"temperature": 1.0}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default="bench/results/sampled-decode.json")
    args = p.parse_args()
    model = load_model(args.model, "int8")
    runner = ModelRunner(model, num_pages=2200, device="cuda", settings=Settings(device="cuda"))
    rng = np.random.default_rng(0)
    res: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for b, steps in ((1, 256), (64, 128)):
            for name, fields in SAMPLING:
                res.setdefault(f"b{b}_{name}_tok_s", []).append(
                    round(engine_rate(runner, model.tokenizer, b, steps, rng, fields), 1))
    write_json(args.json, {"bench": "sampled_decode", "pythonpath": os.environ.get("PYTHONPATH"),
                           "runs": res, "results": {k: stat(v) for k, v in res.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
