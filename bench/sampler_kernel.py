"""Kernel time of the device sampler (cuda/sampling.cu) on flat and chat-like logits.

    python3 bench/sampler_kernel.py --json PATH [--rows 1,64,256]

Logits are ``checks.sampling_cases.make_logits``'s: ``random`` (N(0, 2^2): flat, so a
draw at T ~ 1 often lands past the first 256 candidates) and ``chatlike`` (>99% of the
mass on a few ids). Per (logits, params, rows): the mean of 10 back-to-back launches after
3 warm-ups, on CUDA events, and how many rows took the full-row sort (route 1) and the
narrowing (route 32) (``CupySampler.last_paths``). For an A/B of two trees, run it under
each tree's PYTHONPATH in turn (the JSON records which).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import write_json

from crucible.backend.cupy_sampling import CupySampler
from crucible.checks.sampling_cases import case, make_logits
from crucible.step.row_buffer import pack_rows

PARAMS = (("T1", dict(temperature=1.0)), ("T07", dict(temperature=0.7)),
          ("p09", dict(temperature=1.0, top_p=0.9)))


def main() -> int:
    import cupy as cp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="bench/results/sampler-kernel.json")
    p.add_argument("--rows", default="1,64,256")
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    rows_list = [int(x) for x in args.rows.split(",")]
    rng = np.random.default_rng(0)
    v, most = args.vocab, max(rows_list)
    sampler = CupySampler()
    res: dict[str, dict] = {}
    for kind in ("random", "chatlike"):
        logits = make_logits(kind, most, v, rng)
        dev = cp.asarray(logits)
        for name, kw in PARAMS:
            for rows in rows_list:
                batch = [case(name, r, logits, rng, **kw).sampling(v) for r in range(rows)]
                meta = cp.asarray(pack_rows(batch, most, v))
                for _ in range(3):
                    sampler.launch(dev, meta, rows)
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                for _ in range(10):
                    sampler.launch(dev, meta, rows)
                b.record()
                b.synchronize()
                paths = sampler.last_paths()
                res[f"{kind}_{name}_r{rows}"] = {
                    "kernel_us": round(cp.cuda.get_elapsed_time(a, b) * 100, 1),
                    "full_sorted": int(np.sum(paths & 1 > 0)),
                    "narrowed": int(np.sum(paths & 32 > 0))}
    write_json(args.json, {"bench": "sampler_kernel", "pythonpath": os.environ.get("PYTHONPATH"),
                           "vocab": v, "results": res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
