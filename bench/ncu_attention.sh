#!/usr/bin/env bash
# Nsight Compute of the prefetching exact attention (attn_exact_pf) on one chat launch:
# the sections that say where its time goes (speed of light, occupancy, warp states,
# memory) and the per-instruction source counters, with line info, so the SASS can be cut
# into the kernel's phases (staging, QK, softmax, PV). Random data: no model needed.
#
#     OUT=/some/dir [SHAPE=chat-cohort-1300] [ALT=cuda/attention.cu] bash bench/ncu_attention.sh
#
# The kernel profiled is ALT's attn_exact_pf compiled with -lineinfo (the alt's launch is
# the second attn_exact_pf of bench/prefill_attention.py's first round, hence
# --launch-skip 1); it is the shipped kernel's code when ALT is cuda/attention.cu.
SHAPE=${SHAPE:-chat-cohort-1300}
ALT=${ALT:-cuda/attention.cu}
. "$(dirname "$0")/device_run.sh"
rep="$OUT/ncu-attn-pf-$SHAPE"
ncu --clock-control none --kernel-name regex:attn_exact_pf --launch-skip 1 --launch-count 1 \
    --import-source yes --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters \
    -f -o "$rep" python3 bench/prefill_attention.py --prefetch --lineinfo --alt "alt=$ALT" \
    --shapes "$SHAPE" --rounds 1 > "$rep.log" 2>&1
tail -3 "$rep.log"
ncu -i "$rep.ncu-rep" --page details --csv > "$rep-details.csv"
ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep-sass.csv"
ncu -i "$rep.ncu-rep" --page source --print-source cuda,sass --csv > "$rep-cuda-sass.csv" 2>&1 ||
    ncu -i "$rep.ncu-rep" --page source --print-source cuda --csv > "$rep-cuda.csv" 2>&1
python3 bench/ncu_attention_phases.py "$rep-cuda-sass.csv" | tee "$rep-phases.txt"
ls -la "$OUT"
