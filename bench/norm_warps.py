"""RMSNorm a warp a row (cuda/model_ops.cu rmsnorm_warps) against a block a row
(rmsnorm_rows) on the GPU: the kernels alone, then whole steps in graph replays (random
weights of the default model's shapes, so no model file is needed).

    python3 bench/norm_warps.py [--rounds 3] [--replays 20] [--json PATH]

Kernels: D = 576 (the default model's width) at 64-2,048 rows, ``--launches`` launches back
to back between two events, the kernels' order alternating by round; both must write the
same bits. Steps: attention_fork.py's chat cases (mixed graphs) and decode graphs of 64 and
256 rows, BackendOptions.norm_warps off ("rows") and on ("warps") through option_ab.py,
each setting capturing afresh; the logits must be equal every round.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from attention_fork import CASES
from capacity_classes import chat_steps
from common import stat
from mixed_step import make_batch
from option_ab import option_ab, write

ROWS = (64, 256, 512, 857, 1024, 2048)
RULES = ("rows", "warps")


def kernels_alone(rounds: int, launches: int) -> dict[str, dict]:
    import cupy as cp

    from crucible.kernels.model_ops import rmsnorm_launch

    rng = np.random.default_rng(0)
    w = cp.asarray((0.5 + rng.random(576)).astype(np.float32))
    res: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds):
        for m in ROWS:
            x = cp.asarray(rng.standard_normal((m, 576)).astype(np.float32))
            d, outs = res.setdefault(f"{m} rows", {}), {}
            for rule in RULES if r % 2 == 0 else RULES[::-1]:
                y = cp.empty_like(x)
                rmsnorm_launch(x, w, y, 1e-5, warps=rule == "warps")  # compiled, warm
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for _ in range(launches):
                    rmsnorm_launch(x, w, y, 1e-5, warps=rule == "warps")
                end.record()
                end.synchronize()
                d.setdefault(rule + "_us", []).append(
                    cp.cuda.get_elapsed_time(start, end) * 1e3 / launches)
                outs[rule] = cp.asnumpy(y).view(np.uint32).tobytes()
            if outs["rows"] != outs["warps"]:
                raise SystemExit(f"{m} rows: the two kernels' bits differ")
            d.setdefault("warps_over_rows", []).append(d["warps_us"][-1] / d["rows_us"][-1])
    summary = {n: {k: stat(v) for k, v in d.items()} for n, d in res.items()}
    for n, d in summary.items():
        print(f"{n}: rows {d['rows_us']['median']:.2f} us, warps "
              f"{d['warps_us']['median']:.2f} us", file=sys.stderr)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--launches", type=int, default=200)
    p.add_argument("--json", default="bench/norm-warps.json")
    args = p.parse_args(argv)
    alone = kernels_alone(args.rounds, args.launches)
    runner, batches = chat_steps(CASES)
    be = runner.backend
    mg, dg = be.mixed_graphs, be.graphs
    cases = {name: (b, lambda: mg.num_replays) for name, b in batches.items()}
    rng = np.random.default_rng(1)
    for rows in (64, 256):
        b = make_batch(rng, rows, (300, 2500), (), runner.config.vocab_size, (0, 0), pages=176)
        cases[f"decode {rows} at 300-2,500"] = (b, lambda: dg.num_replays)

    def clear() -> None:  # the kernel is chosen while a graph is captured
        mg.clear()
        dg.clear()

    steps = option_ab(runner, cases, "norm_warps", RULES, args.rounds, args.replays,
                      before=clear)
    write("norm_warps.py", argv, args.json, {"kernels_alone": alone, "steps": steps})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
