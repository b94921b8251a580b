"""A decode step split across streams: do k sub-steps of R/k rows, each on a stream of its
own, overlap their latency-bound launches? A question for the device before any engine
change (#15's batch-64 decode: 45.2k tok/s on the H200 against 60k).

Why it could pay: at 64 rows a decode step is 240 launches of a few microseconds each, none
bound by its bytes or its MMAs, on a GPU that is mostly idle between them
(docs/throughput.md, "What is left": bench/ncu-step-64-h100.json). Why it cannot change a
bit: rows are independent in every kernel (docs/DESIGN.md's numerics contract: a row's
result never depends on the rows beside it), so the split's logits are the whole step's
rows, which this bench checks every round.

How: random weights of the default model's shapes; k runners, each with its own KV pool and
graph memory (graphs replaying at once must not share a working set), the same weights and
the same random histories (runner 0's pool copied to the others). Runner 0's graph of R
rows replayed back to back on one stream ("whole") is timed against the k graphs of R/k
rows replayed together on k streams ("split") and one after another on one stream
("serial", the sum the overlap has to beat), the three alternating by round. Times are
per step (one replay of each graph involved).

One row count a process: with 64-row cases run first, a 128-row case once failed its bit
check in the same process (histories refilled before each case made no difference), while
the engine's own decode graphs, replayed with batches other than their capture's, match
eager steps bit for bit (bench/decode_graph_reuse.py). The cause in this harness was not
found; every figure kept comes from a process of one row count, whose bits matched.

Result (H100, 2026-12-06, bench/stream-overlap-{64,128,256}-h100.json): at 64 rows the
split is slower (0.89x in two, 0.97x in four), at 128 rows 1.03x / 0.90x, at 256 rows
1.09x / 1.06x. Not the lever for #15's 64-row step; docs/throughput.md.

    python3 bench/stream_overlap.py [--rows 64] [--splits 2,4] [--rounds 3]
        [--replays 50] [--json bench/stream-overlap.json]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from common import SMOLLM2, stat, write_json

from crucible.backend import cupy_graphs
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model
from crucible.step.batch import PackedBatch, SegmentSpec, build_packed_batch

PAGES = 16  # a row's pages: 256 positions, more than its history below
HISTORY = (128, 192)  # #15's decode figure: 128-token prompts, 64 steps


def specs(rows: int, vocab: int, seed: int) -> list[SegmentSpec]:
    rng = np.random.default_rng(seed)
    return [SegmentSpec(f"d{i}", [int(rng.integers(vocab))], int(rng.integers(*HISTORY)),
                        list(range(PAGES * i, PAGES * (i + 1))), [0]) for i in range(rows)]


def graph_of(runner: ModelRunner, batch: PackedBatch) -> Any:
    """The decode graph that replays ``batch`` (captured here if need be): a Captured."""
    g = runner.backend.graphs
    before = g.num_replays
    for _ in range(4):  # both twins replayed, each with this batch's metadata
        runner.forward_device(batch)
    if g.num_replays - before < 2:
        raise SystemExit(f"a {batch.num_rows}-row decode step did not replay a graph")
    bucket = next(b for b in cupy_graphs.BUCKETS if b >= batch.num_rows)
    key = next(k for k in reversed(g.graphs) if k[0] == bucket)  # the latest: this batch's
    return g.graphs[key][0]


def timed(launches: list[tuple[Any, Any]], streams: list[Any], replays: int) -> float:
    """ms per step: ``replays`` rounds of every (graph, stream) launch, all streams joined."""
    import cupy as cp

    s0 = streams[0]
    start, end = cp.cuda.Event(), cp.cuda.Event()
    s0.synchronize()
    start.record(s0)
    for s in streams[1:]:
        s.wait_event(start)
    for _ in range(replays):
        for graph, s in launches:
            graph.graph.launch(stream=s)
    for s in streams[1:]:
        s0.wait_event(s.record())
    end.record(s0)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / replays


def replayed_logits(graph: Any, stream: Any, rows: int) -> np.ndarray:
    import cupy as cp

    graph.graph.launch(stream=stream)
    stream.synchronize()
    return cp.asnumpy(graph.logits[:rows]).view(np.uint32)


def one_case(runners: list[ModelRunner], rows: int, k: int, rounds: int, replays: int,
             streams: list[Any]) -> dict[str, Any]:
    vocab = runners[0].config.vocab_size
    sp = specs(rows, vocab, seed=rows)
    whole = graph_of(runners[0], build_packed_batch(sp))
    part = rows // k
    parts = [graph_of(runners[j], build_packed_batch(sp[j * part:(j + 1) * part]))
             for j in range(k)]
    forms = {"whole": [(whole, streams[0])],
             "split": [(p, streams[j]) for j, p in enumerate(parts)],
             "serial": [(p, streams[0]) for p in parts]}
    times: dict[str, list[float]] = {f: [] for f in forms}
    for r in range(rounds):
        for form in list(forms) if r % 2 == 0 else list(forms)[::-1]:
            times[form].append(timed(forms[form], streams[:k], replays))
        # Each graph's logits copied right after its own replay: graphs of one runner may
        # share a logits buffer, so a later replay overwrites an earlier one's.
        want = replayed_logits(whole, streams[0], rows)
        got = np.concatenate([replayed_logits(p, streams[j], part)
                              for j, p in enumerate(parts)])
        if not np.array_equal(want, got):
            raise SystemExit(f"{rows} rows split {k} ways: logits differ from the whole step")
    ratio = {f"whole_over_{f}": stat([a / b for a, b in zip(times["whole"], times[f])])
             for f in ("split", "serial")}
    out = {**{f"{f}_ms": stat(v) for f, v in times.items()}, **ratio,
           "whole_tok_per_s": rows / (stat(times["whole"])["median"] / 1e3),
           "split_tok_per_s": rows / (stat(times["split"])["median"] / 1e3)}
    print(f"{rows} rows / {k}: whole {out['whole_ms']['median']:.3f} ms, split "
          f"{out['split_ms']['median']:.3f}, serial {out['serial_ms']['median']:.3f}; "
          f"whole/split x{ratio['whole_over_split']['median']:.3f}", file=sys.stderr,
          flush=True)
    return out


def fill_pools(runners: list[ModelRunner]) -> None:
    """The same random histories in every runner, before each case: a case's replays write
    its rows' new K/V into the pools of the runners it used."""
    import cupy as cp

    be0 = runners[0].backend
    gen = cp.random.RandomState(0)
    for pool in (be0.k_pool, be0.v_pool):
        pool[...] = gen.standard_normal(pool.shape, dtype=cp.float32)
    for r in runners[1:]:
        r.backend.k_pool[...] = be0.k_pool
        r.backend.v_pool[...] = be0.v_pool


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--splits", default="2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--json", default="bench/stream-overlap.json")
    args = p.parse_args(argv)
    import cupy as cp

    rows = args.rows
    splits = [int(x) for x in args.splits.split(",")]
    if any(k < 1 or rows % k for k in splits):
        raise SystemExit("stream_overlap: --rows must divide by every --splits")
    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    pages = PAGES * rows + 1
    runners = [ModelRunner(model, num_pages=pages, device="cuda",
                           settings=Settings(device="cuda")) for _ in range(max(splits))]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(max(splits))]
    results = {}
    for k in splits:
        fill_pools(runners)
        results[f"{rows} rows / {k}"] = one_case(runners, rows, k, args.rounds, args.replays,
                                                 streams)
    write_json(args.json, {
        "command": "python3 bench/stream_overlap.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "histories": HISTORY, "logits_identical": True, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
