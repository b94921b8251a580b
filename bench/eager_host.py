"""Whose host time an eager forward is: our wrappers', the kernel launches' or the stages'
allocations. Runs without a GPU on a stand-in CuPy, or on the GPU with the real one.

    python3 bench/eager_host.py [--device fake|cuda] [--gemm mma] [--rounds 10]
        [--cases "mixed 1024,prefill 1024,decode 256"] [--profile] [--json PATH]

Why: on the H200 an eager forward of 30 layers takes ~10-12.5 ms of host time
(bench/mixed_step.py's ``host_ms``), as long as the GPU takes for a 1,024-row mixed step
under mma (12.5 ms), so such steps are bound by the host.

The real CupyBackend runs ``ModelRunner._forward_meta`` over bench/mixed_step.py's batches
(random weights of the default model's shapes, context 2,048), each forward timed on the
host clock, in four variants alternating within each round:
  full        as the engine runs it;
  no-launch   every launch through ``kernels.launch.launch`` skipped (all of the mma path's);
  no-alloc    the stages' outputs (``CupyBackend.new``) handed out again from a cache by
              shape instead of allocated (the values are garbage: host time only);
  neither     both.
So full - no-launch is what the launches cost the host, full - no-alloc the allocations,
and neither what is left: our wrappers' own Python. ``--device fake`` (the default) puts
bench/fake_cupy.py in CuPy's place: kernels count their launches and return, arrays are host
arrays, so ``full`` there is our Python alone. Figures: host ms per forward, median and
min-max over ``--rounds`` after three warm-ups; launches per forward (fake only).
``--profile``: the top of a cProfile of five full forwards of each case.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

import fake_cupy
from common import SMOLLM2, stat, write_json

VARIANTS = ("full", "no-launch", "no-alloc", "neither")
DRIVER = ("driver",)  # --driver: the plain launches through the driver (bench/launch_host.py)


def patch(variant: str, be: Any) -> Callable[[], None]:
    """Apply a variant to the backend and the kernel modules; returns the undo."""
    import crucible.kernels.launch as kl

    orig = kl.launch
    mods = [m for m in list(sys.modules.values())
            if getattr(m, "__name__", "").startswith("crucible.")
            and getattr(m, "launch", None) is orig]
    if variant in ("no-launch", "neither"):
        for m in mods:
            m.launch = lambda *a, **k: None
    if variant == "driver":  # plain launches through cuLaunchKernelEx, not CuPy's call
        from launch_host import launch_driver

        for m in mods:
            m.launch = lambda fn, grid, block, args, shared_mem=0, pdl=False: \
                launch_driver(fn, grid, block, args, shared_mem)
    if variant in ("no-alloc", "neither"):
        cache: dict[tuple, Any] = {}
        alloc = type(be).new

        def new(shape: tuple[int, ...]) -> Any:
            key = tuple(shape)
            if key not in cache:
                cache[key] = alloc(be, shape)
            return cache[key]

        be.new = new

    def undo() -> None:
        for m in mods:
            m.launch = orig
        be.__dict__.pop("new", None)

    return undo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="fake", choices=("fake", "cuda"))
    p.add_argument("--gemm", default="mma", choices=("fma", "mma"))
    p.add_argument("--cases", default="mixed 1024,prefill 1024,decode 256")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--driver", action="store_true",
                   help="also time the plain launches through cuLaunchKernelEx (cuda only)")
    args = p.parse_args(argv)
    variants = VARIANTS + (DRIVER if args.driver else ())
    if args.device == "fake":
        fake_cupy.install()
    import cupy as cp
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
    sync = cp.cuda.Device().synchronize
    wanted = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    results, profiles = {}, {}
    for name, d, h, c in CASES:
        if not name.startswith(wanted):
            continue
        batch = make_batch(rng, d, h, c, runner.config.vocab_size)

        def forward() -> float:
            sync()
            t = time.perf_counter()
            runner._forward_meta(be.prepare(batch))
            return (time.perf_counter() - t) * 1e3

        ms: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                undo = patch(v, be)
                try:
                    for _ in range(3 if r == 0 else 1):
                        forward()
                    ms[v].append(forward())
                finally:
                    undo()
        res: dict[str, Any] = {v: stat(x) for v, x in ms.items()}
        med = {v: statistics.median(x) for v, x in ms.items()}
        res["launch_ms"] = round(med["full"] - med["no-launch"], 3)
        res["alloc_ms"] = round(med["full"] - med["no-alloc"], 3)
        if args.driver:
            res["driver_saves_ms"] = round(med["full"] - med["driver"], 3)
        if args.device == "fake":  # the stand-in counts them
            n0 = fake_cupy.launches()
            forward()
            res["launches"] = fake_cupy.launches() - n0
        results[name] = res
        print(f"{name}: " + ", ".join(f"{v} {med[v]:.2f}" for v in VARIANTS)
              + f" ms; launches {res['launch_ms']:.2f}, allocations {res['alloc_ms']:.2f} ms"
              + (f", driver {med['driver']:.2f}" if args.driver else ""),
              flush=True)
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
                               "device": args.device, "gemm": args.gemm, "results": results,
                               **({"profiles": profiles} if profiles else {})})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
