#!/usr/bin/env bash
# The GPU checks of linear_wgmma's SwiGLU epilogue (merged 2026-12-06 from a branch; cuda/
# linear_wgmma.cu, EPI), in the order they gate each other. Random weights: no model.
# About five minutes.
#
#     OUT=/some/dir MAIN=/dir/with/main/unpacked bash bench/wgmma_swiglu_checks.sh
#
# MAIN: main's tree (git archive main | tar -x -C DIR, carried untracked), for step 4.
# 1. tests/test_gpu_linear_wgmma.py (the epilogue's bits against linear_mma_rows' SwiGLU
#    epilogue at M 1-1,024, its swapped-halves control) and tests/test_gpu_mma_fused.py.
# 2. compute-sanitizer memcheck and racecheck over bench/wgmma_swiglu.py --quick.
# 3. bench/wgmma_swiglu.py: the epilogue against the gate/up GEMM then swiglu_rows.
# 4. bench/mixed_step.py on main's tree and this one, alternated in fresh processes
#    (bench/env_ab.py): the chat cohort and 256-row decode steps through run_step (graph
#    replays: the profiled stages of mixed_step split gate/up and SwiGLU apart).
. "$(dirname "$0")/device_run.sh"
gpu_tests wgmma-swiglu tests/test_gpu_linear_wgmma.py tests/test_gpu_mma_fused.py
(cd bench && sanitize wgmma-swiglu python3 wgmma_swiglu.py --quick)
(cd bench && python3 wgmma_swiglu.py --rounds 5 --json "$OUT/wgmma-swiglu.json" 2>&1 | tail -8)
if [ -n "${MAIN:-}" ]; then
    python3 bench/env_ab.py --a-cwd "$MAIN" --a "PYTHONPATH=$MAIN${BASE:+:$BASE}" \
        --b "PYTHONPATH=$PWD${BASE:+:$BASE}" \
        --rounds 2 --drop-runs --json "$OUT/wgmma-swiglu-mixed-ab.json" \
        --metric "results.chat cohort slices: 16x~60 prefill at ~900.run_step_ms.median" \
        --metric "results.decode 256.run_step_ms.median" -- \
        python3 bench/mixed_step.py --rounds 3 --json {json} 2>&1 | tail -8
fi
