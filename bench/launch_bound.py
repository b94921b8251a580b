"""What each kind of launch costs a decode step's graph replay: the step captured with one
kind of stage made free (no launch, its output an existing buffer), timed against the whole
step. A question for #15's batch-64 decode (45.2k tok/s on the H200 against 60k), before
any fusion is built: how much a kind of launch fusion could save at best.

Why not Nsight Compute's table (bench/ncu_step.sh): it times each launch alone, serialised,
1,775 us for a 64-row step whose graph replays in ~1,350 us with PDL, so it overstates the
small kernels. Here the replay is the engine's own (a decode graph of ModelRunner, PDL on),
and a stage's cost is what the replay loses when that stage's launches are there.

The ablated graphs compute garbage (a free stage passes its input on, or an unwritten
buffer): they are timed, never read. The whole step's logits are checked against a second
replay of it each round (a replay is deterministic).

Kinds made free, one graph each (random weights of the default model's shapes, int8, the
mma order, 128-192-position histories as #15's figure):
    norms      every RMSNorm launch of its own (the fused prologues stay)
    rope       RoPE and the K/V store (rope_store)
    attention  the attention launches
    gemms      every int8 GEMM (linear_mma and its fused forms), the LM head included
    all-but-gemms  norms, rope and attention together (what the GEMMs alone take)

    python3 bench/launch_bound.py [--rows 64] [--rounds 5] [--replays 50]
        [--json bench/launch-bound.json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator

import numpy as np
from common import stat, write_json
from graph_variants import Variants

from crucible.engine.runner import ModelRunner

KINDS = ("whole", "norms", "rope", "attention", "gemms", "all-but-gemms")


@contextlib.contextmanager
def free(kind: str, runner: ModelRunner) -> Iterator[None]:
    """While capturing ``runner``'s graph, the stages of ``kind`` launch nothing."""
    import crucible.kernels.linear_mma as lm

    be = runner.backend
    spare: dict[tuple[int, ...], Any] = {}

    def buffer(shape: tuple[int, ...]) -> Any:
        if shape not in spare:
            spare[shape] = be.new(shape)
        return spare[shape]

    parts = {"norms", "rope", "attention"} if kind == "all-but-gemms" else {kind}
    if "norms" in parts:
        be.rmsnorm = lambda x, weight: x
    if "rope" in parts:
        be.rope_and_store = lambda qkv, layer, meta: buffer((qkv.shape[0], be.cfg.q_dim))
    if "attention" in parts:
        be.attention = lambda q, layer, meta: q
    real = lm.linear_mma
    if "gemms" in parts:
        lm.linear_mma = lambda x, wd, out, *a, **k: out
    try:
        yield
    finally:
        lm.linear_mma = real
        for name in ("rmsnorm", "rope_and_store", "attention"):
            be.__dict__.pop(name, None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--json", default="bench/launch-bound.json")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="which graphs to build and time (whole is always one of them)")
    args = p.parse_args(argv)
    kinds = tuple(dict.fromkeys(("whole",) + tuple(args.kinds.split(","))))
    if any(k not in KINDS for k in kinds):
        p.error(f"--kinds: each of {', '.join(KINDS)}")
    v = Variants(args.rows, kinds, free, "launch_bound")

    def check() -> None:
        a, b = v.logits("whole"), v.logits("whole")
        if not np.array_equal(a, b) or not np.isfinite(a.view(np.float32)).all():
            raise SystemExit("launch_bound: the whole step's replays differ or are not finite")

    times = v.time(args.rounds, args.replays, check)
    whole = times["whole"]
    results = {}
    for kind, ts in times.items():
        saved = [w - t for w, t in zip(whole, ts)]
        results[kind] = {"step_ms": stat(ts), "saved_ms": stat(saved),
                         "tok_per_s": args.rows / (stat(ts)["median"] / 1e3)}
        print(f"{kind:>14}: {stat(ts)['median']:.3f} ms a step ({results[kind]['tok_per_s']:,.0f}"
              f" tok/s), saves {stat(saved)['median']:.3f} ms", file=sys.stderr, flush=True)
    write_json(args.json, {
        "command": "python3 bench/launch_bound.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": v.device, "rows": args.rows, "note": "ablated graphs are timed, never read; only 'whole' is "
        "the real step", "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
