"""The fused rows forms of cuda/linear_mma_rows.cu (RMSNorm prologue, SwiGLU epilogue)
against the separate kernels they replace, on the default model's shapes: what sets
``linear_mma.FUSE_MAX_ROWS``.

    PYTHONPATH=$PWD python3 bench/mma_fused_bench.py [--json PATH] [--rounds 5]

Per shape and M: rmsnorm_rows -> linear_mma (-> swiglu_rows), the one fused launch, and for
gate/up rmsnorm_rows -> linear_mma with the SwiGLU epilogue alone ("norm_then_epi"), each
captured 50 times in one graph with PDL (as decode graphs launch them), replayed in
alternating order each round; reported: microseconds per chain, min over rounds. The bits
are not this bench's: tests/test_gpu_mma_fused.py checks fused == separate.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

import numpy as np

from crucible.kernels import linear_mma as lm
from crucible.kernels.device_weight import upload_weight
from crucible.kernels.model_ops import flat_launch, rows_launch

D, REPS = 576, 50
SHAPES = (("gate_up", 3072, True), ("qkv", 960, False))
MS = (1, 2, 4, 8, 16, 32, 64)


def chains(m: int, n: int, swiglu: bool, rng: np.random.Generator
           ) -> tuple[dict[str, Callable[[], None]], tuple[int, ...]]:
    import cupy as cp

    wd = upload_weight(rng.integers(-127, 128, (n, D)).astype(np.int8),
                       (0.001 + 0.01 * rng.random(n)).astype(np.float32))
    norm = cp.asarray((0.5 + rng.random(D)).astype(np.float32))
    x = cp.asarray(rng.standard_normal((m, D)).astype(np.float32))
    xn, y = cp.empty_like(x), cp.empty((m, n), cp.float32)
    h = cp.empty((m, n // 2), cp.float32)
    out = cp.empty((m, n // 2 if swiglu else n), cp.float32)
    form = lm.fused_form(m, n, D, swiglu, max_rows=max(MS))  # past the limit too
    assert form is not None, f"no rows form at M={m}"

    def separate() -> None:
        rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(D), np.float32(1e-5)), pdl=True)
        lm.linear_mma(xn, wd, y, pdl=True)
        if swiglu:
            flat_launch("swiglu_rows", h.size, (y, h, np.int32(n // 2), np.int64(h.size)),
                        pdl=True)

    def fused() -> None:
        lm.linear_mma(x, wd, out, form=form, norm=norm, eps=1e-5, swiglu=swiglu, pdl=True)

    def norm_then_epi() -> None:
        rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(D), np.float32(1e-5)), pdl=True)
        lm.linear_mma(xn, wd, out, form=lm.fused_form(m, n, D, True, norm=False), swiglu=True,
                      pdl=True)

    fns = {"separate": separate, "fused": fused}
    if swiglu:
        fns["norm_then_epi"] = norm_then_epi
    return fns, form


def time_graphs(fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    graphs: dict[str, Any] = {}
    with stream:
        for name, fn in fns.items():
            fn()
            stream.synchronize()
            stream.begin_capture()
            for _ in range(REPS):
                fn()
            graphs[name] = stream.end_capture()
        times: dict[str, list[float]] = {k: [] for k in fns}
        for r in range(rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(stream)
                graphs[name].launch(stream)
                e1.record(stream)
                e1.synchronize()
                times[name].append(cp.cuda.get_elapsed_time(e0, e1) * 1000.0 / REPS)
    return {k: round(min(v), 2) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {}
    for name, n, swiglu in SHAPES:
        for m in MS:
            fns, form = chains(m, n, swiglu, rng)
            got = time_graphs(fns, args.rounds)
            results[f"{name} M={m}"] = {**got, "form": form}
            print(f"{name} M={m}: " + ", ".join(f"{k} {v} us" for k, v in got.items())
                  + f" (form {form})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "mma-fused", "command": "PYTHONPATH=$PWD python3 "
                       "bench/mma_fused_bench.py " + " ".join(argv or sys.argv[1:]),
                       "fuse_max_rows": lm.FUSE_MAX_ROWS, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
