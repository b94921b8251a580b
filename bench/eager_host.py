"""The CuPy backend's own Python per eager forward, on a machine without a GPU: what the
wrappers cost a step before CuPy's own launch and allocation costs come on top.

    python3 bench/eager_host.py [--gemm mma] [--cases "mixed 1024,decode 256"] [--rounds 20]
        [--profile] [--json PATH]

Why: on the H200 an eager forward of 30 layers takes ~10-12.5 ms of host time
(bench/mixed_step.py's ``host_ms``), as long as the GPU takes for a 1,024-row mixed step
under mma (12.5 ms), so such steps are bound by the host. This splits off our part:
bench/fake_cupy.py stands in for CuPy (kernels count their launches and return, arrays are
host arrays), and the real CupyBackend runs ``ModelRunner._forward_meta`` over
bench/mixed_step.py's batches (random weights of the default model's shapes, context 2,048).
Figures: host ms per forward (wall clock; median and min-max over ``--rounds`` after three
warm-ups), launches per forward, and us per launch. ``--profile``: the top of a cProfile of
five forwards of each case. The rest of the H200's host time is CuPy's: the launch (~7.4 us
each, docs/DEVICE.md's figure) and the pool allocations of the stages' outputs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import numpy as np

import fake_cupy
from common import SMOLLM2, stat, write_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gemm", default="mma", choices=("fma", "mma"))
    p.add_argument("--cases", default="mixed 1024,prefill 1024,decode 256")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    fake_cupy.install()
    from mixed_step import CASES, PAGES_PER_ROW, make_batch

    from crucible.backend.cupy_backend import CupyBackend
    from crucible.engine.runner import ModelRunner
    from crucible.engine.settings import Settings
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=1, weights="int8", **{**SMOLLM2, "max_context": 2048})
    settings = Settings(device="cuda", gemm=args.gemm, graph_warmup=False)
    runner = ModelRunner(model, num_pages=PAGES_PER_ROW * 600, device="cuda", settings=settings,
                         backend=CupyBackend(settings.backend_options()))
    be, rng = runner.backend, np.random.default_rng(0)
    wanted = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    results, profiles = {}, {}
    for name, d, h, c in CASES:
        if not name.startswith(wanted):
            continue
        batch = make_batch(rng, d, h, c, runner.config.vocab_size)

        def forward() -> None:
            runner._forward_meta(be.prepare(batch))

        for _ in range(3):
            forward()
        n0 = fake_cupy.launches()
        forward()
        launches = fake_cupy.launches() - n0
        ms = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            forward()
            ms.append((time.perf_counter() - t) * 1e3)
        results[name] = {"host_ms": stat(ms), "launches": launches,
                         "us_per_launch": round(statistics.median(ms) * 1e3 / launches, 2)}
        print(f"{name}: {statistics.median(ms):.2f} ms [{min(ms):.2f}-{max(ms):.2f}], "
              f"{launches} launches, {results[name]['us_per_launch']} us each", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(5):
                forward()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
            profiles[name] = out.getvalue()
            print(profiles[name])
    if args.json:
        write_json(args.json, {"command": "python3 bench/eager_host.py "
                               + " ".join(argv if argv is not None else sys.argv[1:]),
                               "gemm": args.gemm, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
