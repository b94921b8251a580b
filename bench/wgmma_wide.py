"""linear_wgmma's wide forms (two warpgroups a CTA sharing x's stages, (BN, S, 2)) routed in
place of the one-warpgroup forms, against the shipped ``linear_wgmma.ROUTE``, in mixed-graph
replays of the chat steps (attention_fork.py's cases: 147 to ~1,000 rows, where every layer's
GEMM from 128 rows is a warpgroup one). Random weights of the default model's shapes, no
model file.

    python3 bench/wgmma_wide.py [--routes wide,wide-gate-up] [--rounds 3] [--replays 20]
        [--json PATH]

Routes: ``wide`` takes the wide form wherever one fits (gate/up (64, 3, 2), the 576- and
960-column layers (32, 3, 2): for those the same 64 columns a CTA as the shipped (64, 3),
but two warpgroups over them); ``wide-gate-up`` only gate/up's. Per round and case each
route's graph is captured afresh (the route is read while a graph is captured), then
``--replays`` replays run back to back, the routes' order alternating by round; the ratio
is the route's time over the shipped one's. Every route must give the shipped logits bit
for bit, every round (the wide forms compute the one-warpgroup CTAs' values).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from attention_fork import CASES
from capacity_classes import chat_steps, timed_replays
from common import stat, write_json

import crucible.kernels.linear_wgmma as lw

SHIPPED = lw.ROUTE
ROUTES: dict[str, tuple[tuple[int, int, tuple[int, ...]], ...]] = {
    "shipped": SHIPPED,
    "wide": ((512, 2048, (64, 3, 2)), (512, 0, (32, 3, 2)), (256, 2048, (64, 3, 2)),
             (256, 0, (32, 3, 2)), (128, 2048, (64, 3, 2))),
    "wide-gate-up": ((512, 2048, (64, 3, 2)), (512, 0, (64, 3)), (256, 2048, (64, 3, 2)),
                     (256, 0, (32, 3)), (128, 2048, (64, 3, 2))),
}


def use(route: str) -> None:
    lw.ROUTE = ROUTES[route]
    lw._route.cache_clear()  # routes are cached per shape: none may outlive its table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routes", default="wide,wide-gate-up")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", default="bench/wgmma-wide.json")
    args = p.parse_args(argv)
    names = tuple(dict.fromkeys(("shipped",) + tuple(args.routes.split(","))))
    if any(n not in ROUTES for n in names):
        p.error(f"--routes: each of {', '.join(ROUTES)}")
    runner, batches = chat_steps(CASES)
    if not runner.backend.wgmma:
        raise SystemExit("wgmma_wide: the warpgroup-MMA GEMMs are off on this GPU")
    mg = runner.backend.mixed_graphs
    res: dict[str, dict[str, list[float]]] = {}
    try:
        for r in range(args.rounds):
            for case, batch in batches.items():
                got, d = {}, res.setdefault(case, {})
                for n in names if r % 2 == 0 else names[::-1]:
                    use(n)
                    mg.clear()
                    ms, logits = timed_replays(lambda b=batch: runner.forward_device(b),
                                               args.replays, lambda: mg.num_replays)
                    got[n] = logits.view(np.uint32).tobytes()
                    d.setdefault(n + "_ms", []).append(ms)
                if len(set(got.values())) != 1:
                    raise SystemExit(f"wgmma_wide: {case}: a route's logits differ from shipped's")
                for n in names[1:]:
                    d.setdefault(f"{n}_over_shipped", []).append(d[n + "_ms"][-1]
                                                                 / d["shipped_ms"][-1])
            print(f"round {r} done", file=sys.stderr, flush=True)
    finally:
        use("shipped")
    summary: dict[str, Any] = {c: {k: stat(v) for k, v in d.items()} for c, d in res.items()}
    for c, d in summary.items():
        print(c, " ".join(f"{n}: x{d[f'{n}_over_shipped']['median']:.3f} "
                          f"[{d[f'{n}_over_shipped']['min']:.3f}-{d[f'{n}_over_shipped']['max']:.3f}]"
                          for n in names[1:]), f"(shipped {d['shipped_ms']['median']:.2f} ms)")
    import cupy as cp

    write_json(args.json, {
        "command": "python3 bench/wgmma_wide.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "routes": {n: [[e[0], e[1], list(e[2])] for e in ROUTES[n]] for n in names},
        "logits_identical": True, "results": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
