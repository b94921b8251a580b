#!/usr/bin/env bash
# Where a decode step's GEMM launches spend their time inside the graph replay (#15's
# 64-row step: the int8 GEMMs are 56% of it, ~7 us a launch; bench/launch_bound.py).
# Random weights, no model; about three minutes.
#
#     OUT=/some/dir [ROWS="64 256"] bash bench/decode_step_checks.sh
#
# 1. Nsight Systems over the whole decode graph's replays, graph nodes traced, then
#    bench/nsys_step_table.py: what each kernel (by name and grid) moves the step's end,
#    with PDL's overlap, per ROWS.
# 2. bench/launch_bound.py again beside it (the replay's span without the profiler).
# 3. Nsight Compute of the 64-row step's rows-kernel GEMMs (linear_mma_rows): four launches in
#    a row past the warm-up (one layer's qkv, o, gate/up, down): speed of light, occupancy,
#    warp states, memory (the L2 traffic of x's re-reads).
ROWS=${ROWS:-"64 256"}
. "$(dirname "$0")/device_run.sh"
cd bench
HAVE_NSYS=$(command -v nsys || true)  # not every device machine has Nsight Systems
[ -n "$HAVE_NSYS" ] || echo "nsys not found: the graph-node timelines are skipped"
for r in $ROWS; do
    if [ -n "$HAVE_NSYS" ]; then
        nsys profile --cuda-graph-trace=node -f true -o "$OUT/step-$r" python3 launch_bound.py \
            --rows "$r" --kinds whole --rounds 1 --replays 10 --json "$OUT/lb-nsys-$r.json" \
            > "$OUT/nsys-$r.log" 2>&1
        nsys stats -r cuda_gpu_trace -f csv -o "$OUT/step-$r" "$OUT/step-$r.nsys-rep" \
            > "$OUT/nsys-stats-$r.log" 2>&1
        python3 nsys_step_table.py "$OUT/step-${r}_cuda_gpu_trace.csv" \
            --json "$OUT/nsys-step-$r.json" | head -25
    fi
    python3 launch_bound.py --rows "$r" --kinds whole,gemms --rounds 3 \
        --json "$OUT/launch-bound-$r.json" 2>&1 | grep " ms a step"
done
rm -f "$OUT"/*.nsys-rep "$OUT"/*.sqlite
ncu --clock-control none --kernel-name regex:linear_mma_rows --launch-skip 200 \
    --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    python3 launch_bound.py --rows 64 --kinds whole --rounds 1 --replays 2 \
    --json "$OUT/lb-ncu.json" > "$OUT/ncu-rows-gemm-64.txt" 2>&1
grep -E "linear_mma_rows|Duration|Throughput|Achieved Occupancy|Eligible|Hit Rate" \
    "$OUT/ncu-rows-gemm-64.txt" | head -60
