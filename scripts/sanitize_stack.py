"""The batch-1 decode stack's kernels on a small model, for compute-sanitizer (memcheck and
racecheck): linear_rows' QKV form with the combine and gather prologues, attn_decode<1, OW>
and decode_mlp, in linear.cu's order and (int8) their MMA forms under gemm "mma", each
against the stages it replaces, bitwise (crucible/checks/stack_check.py's stages), then
whole decode steps, stack on vs off, eager and from graphs.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_stack.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_stack.py

The model is the g3-9/3 geometry of gpu-engine-check (9 query heads over 3 KV heads,
hidden 192, FFN 256); histories cross the attention tile edges. Prints every failure and
a summary; exit status 1 on any.
"""

from __future__ import annotations

import sys

import numpy as np

from crucible.checks.engine_check import GEOMS, Tally
from crucible.checks.stack_check import check_stack_stages, check_stack_steps


def main() -> int:
    t = Tally()
    rng = np.random.default_rng(4)
    geom = GEOMS["g3-9/3"]
    for weights, gemm in (("int8", "fma"), ("int8", "mma")):
        check_stack_stages(t, "g3-9/3", geom, weights, rng, gemm)
        check_stack_steps(t, "g3-9/3", geom, weights, rng, gemm)
        print(f"{weights} {gemm}: {t.passed} passed, {t.failed} failed so far", flush=True)
    print(f"{t.passed} passed, {t.failed} failed")
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
