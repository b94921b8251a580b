"""Where a mixed graph's capture time goes, part by part (random weights of the default
model's shapes, so no model file is needed).

    python3 bench/capture_parts.py [--rounds 3] [--json PATH]

A capture inside a busy engine lands on the critical path of the step that triggers it:
in the chat workload one 147-row step took 43.6 ms of host time on the H200
(bench/chat-timeline-b1024-h200.json), and every request of that turn waited behind it.
cupy_capture.capture_forward does, in order: a fresh private memory pool; a warm-up
forward in it (kernels, and the pool learning its sizes); stream capture of a second
forward; the graph's instantiation (CuPy's ``end_capture``); then the step's replay. This
script repeats those steps with a timer around each, per case:
  eager_host / eager_ms   the same step run eagerly: host time to queue it, and with the
                          device synchronized (what a step without a graph costs);
  pool_warmup_host        the warm-up forward's host time in a fresh pool (its mallocs);
  pool_warmup_ms          the same synchronized;
  sized_warmup_host       a second warm-up in the now sized pool (no mallocs);
  views_null_host         the graph's padded forward once more, on the default stream
                          with the default allocator (the step's shape, no graph setting);
  views_stream_host       the same on the graph's stream, default allocator;
  views_pool_host         the same on the default stream, the graph's pool as allocator:
                          with views_null and sized_warmup, which of stream and allocator
                          makes a capture's forwards slower than an eager step;
  record_host             begin_capture + the forward's launches under capture;
  end_capture_host        end_capture (instantiation);
  first_replay_ms         the first launch of the graph, synchronized (its upload);
  replay_ms               a later launch, synchronized.
Cases: a chat turn's first joiner (one 84-token slice beside 63 decodes) and a cohort's
step (16 slices of ~60 tokens beside 48 decodes), histories ~900. Figures: min and
median over rounds, milliseconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from common import SMOLLM2, stat, write_json

from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch

CASES = (("joiner: 84-token slice + 63 decodes", 63, (84,)),
         ("cohort: 16 slices + 48 decodes", 48, (60,) * 15 + (75,)))
HISTORY = 900
PAGES_PER_ROW = 72  # 1,152 positions: a history of up to 963 plus a slice of up to 84


def make_batch(rng: np.random.Generator, decodes: int, slices: tuple[int, ...],
               first_page: int, vocab: int) -> PackedBatch:
    specs, page = [], first_page
    for i in range(decodes + len(slices)):
        n = 1 if i < decodes else slices[i - decodes]
        pos = HISTORY + int(rng.integers(0, 64))
        specs.append(SegmentSpec(f"r{i}", rng.integers(0, vocab, n).tolist(), pos,
                                 list(range(page, page + PAGES_PER_ROW)), [n - 1]))
        page += PAGES_PER_ROW
    return build_packed_batch(specs)


def parts(runner: ModelRunner, batch: PackedBatch) -> dict[str, float]:
    import cupy as cp

    be, forward = runner.backend, runner._forward_meta
    mg, dev = be.mixed_graphs, cp.cuda.Device()
    out: dict[str, float] = {}

    def clock(name: str, fn: Any, sync: Any = None) -> Any:
        t = time.perf_counter()
        r = fn()
        out[f"{name}_host"] = (time.perf_counter() - t) * 1e3
        if sync is not None:
            sync()
            out[f"{name}_ms"] = (time.perf_counter() - t) * 1e3
        return r

    dev.synchronize()
    clock("eager", lambda: forward(be.prepare(batch)), dev.synchronize)
    key = mg.key(batch)
    stream, pool = mg.stream, cp.cuda.MemoryPool()
    meta_dev = cp.asarray(mg.host_meta(None, key))
    views = mg._views(meta_dev, key)
    dev.synchronize()
    with cp.cuda.using_allocator(pool.malloc), stream:
        clock("pool_warmup", lambda: forward(views), stream.synchronize)
        clock("sized_warmup", lambda: forward(views), stream.synchronize)
        t = time.perf_counter()
        stream.begin_capture()
        forward(views)
        out["record_host"] = (time.perf_counter() - t) * 1e3
        graph = clock("end_capture", stream.end_capture)
    clock("views_null", lambda: forward(views), dev.synchronize)
    with stream:
        clock("views_stream", lambda: forward(views), stream.synchronize)
    with cp.cuda.using_allocator(pool.malloc):
        clock("views_pool", lambda: forward(views), dev.synchronize)
    mg.ring.upload(mg.host_meta(batch, key), meta_dev, stream)
    clock("first_replay", lambda: graph.launch(stream=stream), stream.synchronize)
    clock("replay", lambda: graph.launch(stream=stream), stream.synchronize)
    out["key"] = list(key)
    del graph
    pool.free_all_blocks()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="bench/capture-parts.json")
    args = p.parse_args(argv)
    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    per_round = max(d + len(s) for _, d, s in CASES) * PAGES_PER_ROW
    runner = ModelRunner(model, num_pages=per_round + 16, device="cuda",
                         settings=Settings(device="cuda", mixed_graph_rows=1024))
    rng = np.random.default_rng(0)
    res: dict[str, dict[str, list[float]]] = {}
    keys: dict[str, list[int]] = {}
    for r in range(args.rounds + 1):  # round 0 compiles: not kept
        for name, decodes, slices in CASES:
            got = parts(runner, make_batch(rng, decodes, slices, 0, model.config.vocab_size))
            keys[name] = got.pop("key")
            if r:
                for k, v in got.items():
                    res.setdefault(name, {}).setdefault(k, []).append(v)
        if r:
            print(f"round {r}: " + "; ".join(
                f"{n}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in d.items())
                for n, d in res.items()), file=sys.stderr, flush=True)
    write_json(args.json, {"command": "python3 bench/capture_parts.py "
                           + " ".join(argv or sys.argv[1:]), "history": HISTORY,
                           "keys": keys,
                           "results": {n: {k: stat(v) for k, v in d.items()}
                                       for n, d in res.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
