"""Decode graphs replayed with batches other than the one they were captured with, against
eager steps, at the default model's shapes (random weights): the question
bench/stream_overlap.py raised when a 128-row case failed its bit check only after 64-row
cases had run in the same process.

Two runners share the weights and the same random KV histories; one replays decode graphs,
the other runs every step eagerly (``decode_graphs=False``). Both see the same sequence of
decode batches (each written K/V lands in both pools alike), and every step's logits must
be equal bit for bit. The sequence walks buckets down and up with fresh histories, so a
graph captured for one batch is replayed for others.

    python3 bench/decode_graph_reuse.py [--json bench/decode-graph-reuse.json]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from common import SMOLLM2, write_json
from stream_overlap import PAGES, fill_pools, specs

from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model
from crucible.step.batch import build_packed_batch

SEQUENCE = ((64, 64, 0, 64), (128, 128, 0, 128), (128, 128, 0, 64), (128, 128, 64, 128),
            (64, 7, 0, 64), (256, 256, 0, 256), (256, 256, 0, 128), (32, 5, 0, 32))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="bench/decode-graph-reuse.json")
    args = p.parse_args(argv)
    import cupy as cp

    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    pages = PAGES * 256 + 1
    graphs = ModelRunner(model, num_pages=pages, device="cuda", settings=Settings(device="cuda"))
    eager = ModelRunner(model, num_pages=pages, device="cuda",
                        settings=Settings(device="cuda", decode_graphs=False))
    fill_pools([graphs, eager])
    vocab = model.config.vocab_size
    results, bad = [], 0
    for rows, seed, lo, hi in SEQUENCE:
        batch = build_packed_batch(specs(rows, vocab, seed)[lo:hi])
        for rep in range(3):  # both twins, then one of them again
            before = graphs.backend.graphs.num_replays
            got = cp.asnumpy(graphs.forward_device(batch)).view(np.uint32)
            replayed = graphs.backend.graphs.num_replays > before
            want = cp.asnumpy(eager.forward_device(batch)).view(np.uint32)
            rows_bad = np.nonzero((got != want).any(axis=1))[0]
            bad += len(rows_bad) > 0
            results.append({"rows": hi - lo, "seed": seed, "slice": [lo, hi], "rep": rep,
                            "replayed": replayed, "rows_differing": int(len(rows_bad)),
                            "first_rows": rows_bad[:8].tolist()})
            print(f"{hi - lo:4d} rows (seed {seed}, rows {lo}..{hi}) rep {rep}: "
                  f"replayed={replayed} differing rows {len(rows_bad)}", file=sys.stderr)
    write_json(args.json, {"command": "python3 bench/decode_graph_reuse.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                           "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                           "steps": results, "steps_differing": bad})
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
