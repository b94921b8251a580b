"""Eager decode steps of a SmolLM2-shaped random model, for Nsight Compute to profile.

    ncu --clock-control none --kernel-name regex:'attn_decode|linear_rows' --launch-count 12 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        python3 scripts/ncu_decode.py [--rows 1] [--steps 2] [--gemm fma|mma]

Runs ``steps`` eager decode steps of ``rows`` requests with 192-token histories (no graphs:
ncu times each kernel alone). Nothing is measured here; ncu reports per-kernel figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_kernels import SMOLLM2  # noqa: E402

from crucible.step.batch import SegmentSpec, build_packed_batch  # noqa: E402
from crucible.engine.runner import ModelRunner  # noqa: E402
from crucible.engine.settings import Settings  # noqa: E402
from crucible.model.tiny import tiny_random_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--gemm", default="fma", choices=("fma", "mma"),
                   help="the int8 GEMMs' order (mma: the decode stack's MMA forms at one row)")
    args = p.parse_args(argv)
    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    runner = ModelRunner(model, num_pages=max(64, args.rows) * 20, device="cuda",
                         settings=Settings(device="cuda", gemm=args.gemm))
    runner.backend.graphs = None
    for step in range(args.steps):
        runner.forward(build_packed_batch([
            SegmentSpec(f"r{i}", [7], 192 + step, list(range(i * 20, i * 20 + 13)), [0])
            for i in range(args.rows)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
