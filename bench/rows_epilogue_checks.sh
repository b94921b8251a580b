#!/usr/bin/env bash
# The GPU checks of linear_mma_rows' early epilogue loads (merged 2026-12-06 from a branch:
# the finisher's first output's scales load before the PDL wait and its residual right
# after it, off the end of the critical path), in the order they gate each other. Random
# weights: no model. About four minutes.
#
#     OUT=/some/dir MAIN=/dir/with/main/unpacked bash bench/rows_epilogue_checks.sh
#
# 1. tests/test_gpu_linear_mma.py and tests/test_gpu_mma_fused.py: every rows form's bits
#    against the tile kernel and the separate kernels, residual and SwiGLU included.
# 2. compute-sanitizer memcheck and racecheck over bench/gemm_mma_bench.py on the o and
#    down shapes (the residual's GEMMs) at 16-64 rows, one round.
# 3. bench/launch_bound.py --kinds whole on main's tree and this one, alternated in fresh
#    processes (bench/env_ab.py): the 64- and 256-row decode graphs' replay.
MAIN=${MAIN:?set MAIN to main unpacked (git archive main | tar -x -C DIR)}
. "$(dirname "$0")/device_run.sh"
gpu_tests rows-epilogue tests/test_gpu_linear_mma.py tests/test_gpu_mma_fused.py
sanitize rows-epilogue python3 bench/gemm_mma_bench.py --rounds 1 --ms 0.2 --shapes o,down \
    --m 16,64
for r in 64 256; do
    python3 bench/env_ab.py --a-cwd "$MAIN/bench" --b-cwd "$PWD/bench" \
        --a "PYTHONPATH=$MAIN${BASE:+:$BASE}" --b "PYTHONPATH=$PWD${BASE:+:$BASE}" \
        --rounds 3 --drop-runs --json "$OUT/rows-epilogue-ab-$r.json" \
        --metric results.whole.step_ms.median -- \
        python3 launch_bound.py --rows "$r" --kinds whole --rounds 3 --json {json} 2>&1 | tail -6
done
