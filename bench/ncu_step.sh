#!/usr/bin/env bash
# Which kernels a decode step of ROWS rows is made of, timed one by one under Nsight
# Compute (scripts/ncu_decode.py's eager steps: the kernels a decode graph replays),
# then tabulated by bench/ncu_step_table.py.
#
#     OUT=/some/dir ROWS=64 GEMM=mma bash bench/ncu_step.sh
ROWS=${ROWS:-64}
GEMM=${GEMM:-mma}
. "$(dirname "$0")/device_run.sh"
ncu --clock-control none --cache-control none --csv \
    --metrics gpu__time_duration.sum,launch__registers_per_thread \
    python3 scripts/ncu_decode.py --rows "$ROWS" --steps 2 --gemm "$GEMM" \
    > "$OUT/ncu-step-$ROWS.csv" 2> "$OUT/ncu-step-$ROWS.err"
python3 bench/ncu_step_table.py "$OUT/ncu-step-$ROWS.csv" --steps 2 \
    --json "$OUT/ncu-step-$ROWS.json" \
    --note "ncu, eager decode step of $ROWS rows, 192-token histories, --gemm $GEMM"
