"""Host time per step of the prefix cache's miss workload with instant kernels
(bench/host_step.py's ``InstantRunner``): what the cache's own Python adds to a step when
no prompt shares a page, on and off in one process.

    python3 bench/miss_host.py [--requests 1024] [--repeat 3] [--json PATH]

Why: on a GPU host whose eager steps are as long on the host as on the device, the miss
workload (bench/prefix_cache_bench.py --workload miss: unique prompts of 256-1,023 tokens,
64 out, LLM's budget of 2,048 and 512 running) pays the cache's host work in full
(docs/prefix-cache.md, bfa97e7 on an H100). Here the tiny model's tokenizer and a pool of
the H100's size; the same requests on and off, ``--repeat`` times each alternating (a
warm-up engine first). Figures: the least process CPU ms a step on and off, and their
difference. Against another tree, fresh processes
alternating (bench/env_ab.py, this script from this tree, ``crucible`` from either):

    python3 bench/env_ab.py --a PYTHONPATH=/tmp/base --b PYTHONPATH=$PWD --rounds 10 \\
        --metric on_ms --metric off_ms --metric extra_ms --json bench/x.json -- \\
        python3 $PWD/bench/miss_host.py --json {json}
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np
from common import write_json
from host_step import TEXT, InstantRunner

from crucible.engine.engine import LLMEngine
from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer

PAGES = 98_000  # the miss bench's pool on an H100 (~98,400 pages)


def ms_per_step(cache: bool, requests: int, seed: int) -> tuple[float, int]:
    tok, rng = tiny_tokenizer(), np.random.default_rng(seed)
    runner = InstantRunner(PAGES, TINY_VOCAB_SIZE, 8192, tok.encode(TEXT))
    runner.backend = SimpleNamespace(arithmetic="instant")
    eng = LLMEngine(runner, tok, SchedulerConfig(token_budget=2048, max_queue=requests,
                                                 max_running=512),
                    prefix_cache=PrefixCache(("bench",), "instant", PAGES) if cache else None)
    eng.detokenize = False
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for _ in range(requests):
        eng.add_request(rng.integers(0, TINY_VOCAB_SIZE, int(rng.integers(256, 1024))).tolist(),
                        params)
    t, steps = time.process_time(), 0
    while eng.requests:
        eng.step()
        steps += 1
    return (time.process_time() - t) / steps * 1e3, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="runs of each, the least kept")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    ms_per_step(True, 128, args.seed + 1)  # warm-up
    ons, offs = [], []
    for r in range(args.repeat):  # the least of each: interference only ever adds
        for cache in ((True, False) if r % 2 == 0 else (False, True)):
            (ons if cache else offs).append(ms_per_step(cache, args.requests, args.seed))
    (on, steps), (off, steps_off) = min(ons), min(offs)
    res = {"command": "python3 bench/miss_host.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "steps": [steps, steps_off],
        "on_ms": on, "off_ms": off, "extra_ms": on - off}
    print(f"on {on:.3f} ms a step, off {off:.3f}, the cache's extra {on - off:.3f} "
          f"({steps} steps)")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
