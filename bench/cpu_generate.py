"""CPU prefill and single-stream decode speed of the numpy backend on the default model.

    python3 bench/cpu_generate.py [--model M] [--weights int8] [--rounds 3] [--json PATH]
                                  [--threads N] [--blas-tiles [--layer-tile T]]

The backend runs the compiled kernels when they are built (``kernels`` in the JSON says
which: avx2 or scalar), else the BLAS tile path; ``--blas-tiles`` forces the latter, for a
comparison on the same machine.

Prefill: one request of each prompt length, timed as its first forward (TTFT minus
sampling). Decode: single stream after a 64-token prompt, steps after the first. Warm-up
(BLAS tile calibration, first-touch of the page pool) is excluded. Each figure is the median
over rounds with the min-max range; prompt lengths alternate order between rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from common import stat, write_json

from crucible.backend import cpu_ext, numpy_backend
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.model.loader import load_model
from crucible.engine.runner import ModelRunner


def prefill_tok_s(runner: ModelRunner, tokens: list[int]) -> float:
    pages = list(range(runner.num_pages - 1, runner.num_pages - 1 - (-(-len(tokens) // 16)), -1))
    batch = build_packed_batch([SegmentSpec("p", tokens, 0, pages, [len(tokens) - 1])])
    t = time.perf_counter()
    runner.forward(batch)
    return len(tokens) / (time.perf_counter() - t)


def decode_tok_s(runner: ModelRunner, prompt: list[int], steps: int) -> float:
    pages = list(range(-(-(len(prompt) + steps) // 16)))
    logits = runner.forward(build_packed_batch(
        [SegmentSpec("d", prompt, 0, pages, [len(prompt) - 1])]))
    t = time.perf_counter()
    for i in range(steps):
        nxt = int(np.argmax(logits[0]))
        logits = runner.forward(build_packed_batch(
            [SegmentSpec("d", [nxt], len(prompt) + i, pages, [0])]))
    return steps / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--weights", default="int8", choices=("int8", "f32"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lengths", default="64,256")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--json", default="bench/cpu-generate.json")
    p.add_argument("--threads", type=int, default=None,
                   help="CRUCIBLE_CPU_THREADS for the compiled kernels (default: all cores)")
    p.add_argument("--blas-tiles", action="store_true",
                   help="run the BLAS tile fallback even where the compiled kernels are built")
    p.add_argument("--layer-tile", type=int, default=None,
                   help="BLAS tile path only, experiment: GEMM column-tile width of the layers "
                        "(default: LAYER_TILE); changes the arithmetic order, not just speed")
    args = p.parse_args(argv)
    if args.threads is not None:
        os.environ[cpu_ext.ENV_THREADS] = str(args.threads)
    if args.blas_tiles:
        cpu_ext._ext = None  # as if the extension were not built
    if args.layer_tile is not None:
        numpy_backend.LAYER_TILE = args.layer_tile
    model = load_model(args.model, args.weights)
    runner = ModelRunner(model, num_pages=64)
    backend = runner.backend
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = {n: rng.integers(0, model.config.vocab_size, n).tolist() for n in lengths}
    prefill_tok_s(runner, prompts[lengths[0]][:16])  # warm-up: threads, pool pages
    decode_tok_s(runner, prompts[lengths[0]][:8], 2)
    pre: dict[int, list[float]] = {n: [] for n in lengths}
    dec: list[float] = []
    for r in range(args.rounds):
        order = lengths if r % 2 == 0 else lengths[::-1]
        for n in order:
            pre[n].append(prefill_tok_s(runner, prompts[n]))
        dec.append(decode_tok_s(runner, prompts[lengths[0]], args.decode_steps))
        print(f"round {r}: " + ", ".join(f"prefill-{n} {pre[n][-1]:.1f}" for n in lengths)
              + f", decode {dec[-1]:.2f} tok/s", file=sys.stderr)
    result = {
        "command": "python3 bench/cpu_generate.py " + " ".join(argv or sys.argv[1:]),
        "model": args.model, "weights": args.weights, "rounds": args.rounds,
        "kernels": backend.kernel, "threads": backend.threads,
        "layer_tile": numpy_backend.LAYER_TILE if backend.kernel == "blas-tiles" else None,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "processor": platform.processor() or platform.machine()},
        "prefill_tok_s": {str(n): stat(v) for n, v in pre.items()},
        "decode_tok_s": stat(dec), "decode_steps": args.decode_steps,
        "decode_prompt_tokens": lengths[0],
    }
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
