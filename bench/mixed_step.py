"""Where a packed mixed step's time goes on the GPU (random weights of the default model's
shapes, so no model file is needed).

    python3 bench/mixed_step.py [--rounds 3] [--json PATH]

Cases: the steps the throughput workload (bench/throughput.py) is made of under load, a
token budget's worth of decode rows with long histories plus a prefill chunk, and for
comparison a lone 1,024-token prefill and a pure decode step of 256 rows; then two small
mixed steps of moderate load (tens of running requests, a prompt arriving), and the chat
workload's two steps, whose slices follow a cached history (a turn's first joiner, a
cohort: bench/chat_timeline.py). Per case:
  stages   GPU ms per forward stage summed over layers (ProfiledBackend: a spin kernel
           holds the GPU while the host queues, so these are kernel times back to back),
           with TFLOP/s for the GEMM stages;
  gpu_ms   their sum;
  eager_ms one eager forward's wall time (the backend's prepare + the forward), synchronized
           (host launches and GPU together: what an eager step costs the engine);
  host_ms  the host time of queuing that forward (no synchronization);
  run_step_ms / run_step_host_ms  the same through ModelRunner.forward_device, i.e. the
           backend's run_step: a graph replay where the step has one (mixed steps up to 512
           rows, decode steps up to 512 rows), else the same eager forward;
Each mixed case runs twice per round, alternating: as the backend runs it (attention in two
launches, decode rows and prefill slices apart: kernels/attention.py) and, as the baseline
"one launch", with the metadata's split removed on this instance so one tiled launch covers
every segment (the code before the split).
Figures: min and median over rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from common import SMOLLM2, stat, write_json

from crucible.backend.profile import ProfiledBackend
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model import llama
from crucible.model.tiny import tiny_random_model
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch

# (name, decode rows, their history range, prefill chunk lengths)
CASES = (
    ("mixed 1024: 496 decode + 528 prefill", 496, (400, 1200), (528,)),
    ("mixed 2048: 768 decode + 2x640 prefill", 768, (400, 1200), (640, 640)),
    ("prefill 1024", 0, (0, 0), (1024,)),
    ("decode 256", 256, (400, 1200), ()),
    ("decode 64", 64, (128, 192), ()),  # gpu_generate's batch-64 decode: 128-token prompts
    ("mixed 256: 32 decode + 224 prefill", 32, (100, 900), (224,)),
    ("mixed 96: 16 decode + 2x40 prefill", 16, (100, 900), (40, 40)),
    # The chat workload's steps (bench/chat_timeline.py): a turn's slices start past a cached
    # history of ~900 tokens (PREFILL_START), beside the other users' decodes.
    ("chat joiner: 63 decode + 84 prefill at ~900", 63, (850, 1000), (84,)),
    ("chat cohort: 48 decode + 16x~60 prefill at ~900", 48, (850, 1000), (60,) * 15 + (75,)),
    # the cohort's two halves alone: which attention launch holds its time
    ("chat cohort slices: 16x~60 prefill at ~900", 0, (0, 0), (60,) * 15 + (75,)),
    ("chat decode 48 at ~900", 48, (850, 1000), ()),
)
PREFILL_START = {"chat joiner": (850, 950), "chat cohort": (850, 950)}  # by name prefix
PAGES_PER_ROW = 80  # 1,280 positions: every history above plus its token


def make_batch(rng: np.random.Generator, decode: int, hist: tuple[int, int],
               chunks: tuple[int, ...], vocab: int, start: tuple[int, int] = (0, 0),
               pages: int = PAGES_PER_ROW) -> PackedBatch:
    """``decode`` one-row segments at histories in ``hist``, then a prefill slice per chunk
    starting at a position in ``start`` (0: a new prompt); ``pages`` of its own each."""
    specs, page = [], 0
    for i in range(decode):
        pos = int(rng.integers(hist[0], hist[1]))
        specs.append(SegmentSpec(f"d{i}", [int(rng.integers(vocab))], pos,
                                 list(range(page, page + pages)), [0]))
        page += pages
    for j, n in enumerate(chunks):
        pos = int(rng.integers(start[0], start[1])) if start[1] > start[0] else start[0]
        specs.append(SegmentSpec(f"p{j}", rng.integers(0, vocab, n).tolist(), pos,
                                 list(range(page, page + pages)), [n - 1]))
        page += pages
    return build_packed_batch(specs)


def gemm_flops(stage: str, t: int, f: int) -> float:
    h, kv, ffn, layers, vocab = 576, 192, 1536, 30, 49152
    shapes = {"qkv": (t, h, h + 2 * kv), "o": (t, h, h), "gate_up": (t, h, 2 * ffn),
              "down": (t, ffn, h), "final": (f, h, vocab)}
    if stage not in shapes:
        return 0.0
    m, k, n = shapes[stage]
    return 2.0 * m * k * n * (1 if stage == "final" else layers)


def measure(runner: ModelRunner, batch: PackedBatch, one_launch: bool) -> dict[str, Any]:
    import dataclasses

    import cupy as cp

    cfg, be = runner.config, runner.backend
    if one_launch:
        prepare = type(be).prepare
        be.prepare = lambda b: dataclasses.replace(prepare(be, b), mixed=None)
    pb = ProfiledBackend(be)
    llama.forward(cfg, pb, batch)  # warm-up (compiles)
    pb.stage_ms()
    llama.forward(cfg, pb, batch)
    stages = pb.stage_ms()
    dev = cp.cuda.Device()

    def timed(fn: Any, warm: int = 1) -> tuple[float, float]:
        for _ in range(warm):  # warm-up (a graph's sightings and capture)
            fn()
        dev.synchronize()
        t = time.perf_counter()
        fn()
        host = time.perf_counter() - t
        dev.synchronize()
        return host * 1e3, (time.perf_counter() - t) * 1e3

    f = int(batch.final_rows.shape[0])
    host, eager = timed(lambda: runner._forward_meta(be.prepare(batch)))
    out = {"gpu_ms": sum(stages.values()), "eager_ms": eager, "host_ms": host}
    if not one_launch:  # through run_step: a graph replay where the step has one
        # three calls first: a mixed or prefill key is captured on its second sighting,
        # so fewer left the timed call a capture in the first round
        out["run_step_host_ms"], out["run_step_ms"] = timed(
            lambda: runner.forward_device(batch), warm=3)
    else:
        del be.prepare
    for k, v in stages.items():
        out[f"{k} ms"] = v
        fl = gemm_flops(k, batch.num_rows, f)
        if fl:
            out[f"{k} TFLOP/s"] = fl / (v * 1e-3) / 1e12
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="bench/mixed-step.json")
    p.add_argument("--gemm", default="mma", choices=("fma", "mma"),
                   help="the int8 GEMMs' order (CRUCIBLE_GEMM)")
    p.add_argument("--cases", default="", help="comma-separated name prefixes to run (all)")
    p.add_argument("--mixed-graph-rows", type=int, default=1024,
                   help="the largest mixed step a graph replays (serve's 1,024)")
    args = p.parse_args(argv)
    wanted = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    cases = tuple(c for c in CASES if not wanted or c[0].startswith(wanted))
    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    runner = ModelRunner(model, num_pages=PAGES_PER_ROW * 800, device="cuda",
                         settings=Settings(device="cuda", gemm=args.gemm,
                                           mixed_graph_rows=args.mixed_graph_rows))
    rng = np.random.default_rng(0)
    def start(name: str) -> tuple[int, int]:
        return next((v for k, v in PREFILL_START.items() if name.startswith(k)), (0, 0))

    batches = {name: make_batch(rng, d, h, c, runner.config.vocab_size, start(name))
               for name, d, h, c in cases}
    runs = [(name, False) for name in batches]
    runs += [(name, True) for name, d, _, c in cases if d and c]  # mixed: the baseline
    res: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for name, one in runs if r % 2 == 0 else runs[::-1]:
            label = name + (" (one launch)" if one else "")
            for k, v in measure(runner, batches[name], one).items():
                res.setdefault(label, {}).setdefault(k, []).append(v)
        print(f"round {r} done", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {name: {k: stat(v) for k, v in d.items()}
                               for name, d in res.items()}
    for name, d, _, c in cases:
        if d and c:
            a, b = res[name], res[name + " (one launch)"]
            summary[name]["one_launch_over_split"] = stat(
                [x / y for x, y in zip(b["gpu_ms"], a["gpu_ms"])])
    for name, d in summary.items():
        rs = d.get("run_step_ms", {}).get("median", float("nan"))
        print(f"{name}: gpu {d['gpu_ms']['median']:.2f} ms, eager {d['eager_ms']['median']:.2f}"
              f" ms, host {d['host_ms']['median']:.2f} ms, run_step {rs:.2f} ms",
              file=sys.stderr)
    write_json(args.json, {"command": "python3 bench/mixed_step.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                           "cases": {n: {"decode_rows": d, "history": list(h),
                                         "prefill_chunks": list(c),
                                         "prefill_start": list(start(n))}
                                     for n, d, h, c in cases},
                           "results": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
