"""Where a pipelined decode step's time goes on the GPU (random weights, the default
model's shapes, so no model file is needed).

    python3 bench/gpu_step.py [--steps 200] [--rounds 3] [--json PATH]

Per batch size (1 and 64 rows, 192-token histories), each over ``--steps`` steps queued back
to back with one synchronization at the end, so the host never holds the device back:
  graph      the decode graph (forward and greedy argmax) replayed alone on the default
             stream, as steps replay (its metadata already on the device); "own stream":
             on the stream it was captured on, for comparison;
  +meta      each replay preceded by its metadata upload (page-locked, async, on the
             upload stream; one twin, so each upload waits for the previous replay);
  +sample    whole steps through ModelRunner.launch_sample (both twins, the metadata
             uploaded ahead, the ids copied back), never waiting for the host;
  pipelined  ModelRunner.launch_sample as the engine drives it (feed from the device,
             step t's ids read after step t+1 is queued), host work included.
Batch 1 runs twice: with the decode stack (three kernels per layer, the default) and with
it off ("b1 layers", five kernels per layer), alternating in each round.
The differences are the per-step costs of each layer of the step. Figures: min and median
over rounds of microseconds per step.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from common import SMOLLM2, stat, write_json

from crucible.backend.cupy_graphs import BUCKETS, graph_capacity
from crucible.step.rows import row_sampling
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.sampling import SamplingParams
from crucible.kernels.variants import score_capacity
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import tiny_random_model



def step_costs(runner: ModelRunner, b: int, steps: int, history: int) -> dict[str, float]:
    import cupy as cp

    be, vocab = runner.backend, runner.config.vocab_size
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(b)]

    def batch(p: int, tok: int = 7):
        return build_packed_batch([SegmentSpec(f"r{i}", [tok], p, tables[i], [0])
                                   for i in range(b)])

    greedy = SamplingParams(temperature=0.0)
    rows = [row_sampling(i, greedy, prompt=(), output=(), seed=0, stop_ids=(), vocab_size=vocab)
            for i in range(b)]
    runner.forward_sample(batch(history), rows)  # captures both twins
    g = be.graphs
    bucket = next(x for x in BUCKETS if x >= b)
    capacity = graph_capacity(score_capacity(history + 1), g.ceiling)  # as run() keys it
    cap = g.graphs[(bucket, capacity)][g.last]
    meta = g.host_meta(batch(history), bucket, g.table_width(capacity))
    out: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        fn()
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        cp.cuda.Device().synchronize()
        out[name] = (time.perf_counter() - t) / steps * 1e6

    timed("graph", lambda: cap.graph.launch(stream=cp.cuda.Stream.null))
    timed("graph, own stream", lambda: cap.graph.launch(stream=g.stream))
    timed("+meta", lambda: cap.replay_default(meta, g.ring, g.upload))
    # Both twins, the argmax's ids copied back (greedy rows); nothing waits for the host.
    timed("+sample", lambda: runner.launch_sample(batch(history), rows))
    feed = np.arange(b, dtype=np.int32)
    t = time.perf_counter()
    pend = runner.launch_sample(batch(history), rows)
    for k in range(steps):
        nxt = runner.launch_sample(batch(history, 0), rows, feed=feed)
        pend.result()
        pend = nxt
    pend.result()
    out["pipelined"] = (time.perf_counter() - t) / (steps + 1) * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--history", type=int, default=192)
    p.add_argument("--json", default="bench/gpu-step.json")
    p.add_argument("--only", default=None, help="comma list of b1, b1 layers, b64 (all)")
    args = p.parse_args(argv)
    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    runner = ModelRunner(model, num_pages=64 * 16 + 16, device="cuda")
    res: dict[str, list[float]] = {}
    # "b1 layers": batch 1 with the decode stack off (five kernels per layer), the baseline
    # of the stack in the same run; the order alternates between rounds.
    configs = [("b1", 1, True), ("b1 layers", 1, False), ("b64", 64, True)]
    if args.only:
        configs = [c for c in configs if c[0] in args.only.split(",")]
    for r in range(args.rounds):
        for label, b, stack in configs if r % 2 == 0 else configs[::-1]:
            runner.backend.set_decode_stack(stack)
            for k, v in step_costs(runner, b, args.steps, args.history).items():
                res.setdefault(f"{label} {k} us", []).append(v)
        print(f"round {r}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in res.items()),
              file=sys.stderr, flush=True)
    write_json(args.json, {"command": "python3 bench/gpu_step.py " + " ".join(argv or sys.argv[1:]),
                           "history": args.history, "score_capacity": score_capacity(args.history + 1),
                           "results": {k: stat(v) for k, v in res.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
