#!/usr/bin/env bash
# Where the warpgroup GEMM's SwiGLU epilogue pays in the decode graphs. On an H100 its
# 256-row decode graph replayed 1.066x the separate kernels' time while 128, 192, 384 and
# 512 rows ran 0.965-0.982x (bench/wgmma-swiglu-ab-h100.json), and only with PDL on: the
# loss is in how it overlaps the down GEMM launched after it. linear_wgmma.SWIGLU_SKIP_ROWS
# leaves out 256-383 rows; this times the graphs' row buckets from 160 to 768 under the
# shipped skip, the epilogue nowhere (swiglu-off) and everywhere (swiglu-all), in one
# process with the logits compared bit for bit (bench/route_forms.py), so the skip can be
# set from the figures. Random weights, no model; about four minutes.
#
#     OUT=/some/dir [ROWS="160 256 ..."] bash bench/wgmma_swiglu_sweep.sh
ROWS=${ROWS:-"160 256 320 448 640 768"}
. "$(dirname "$0")/device_run.sh"
cd bench
for r in $ROWS; do
    echo "rows $r:"
    python3 route_forms.py --rows "$r" --routes shipped,swiglu-off,swiglu-all --rounds 3 \
        --json "$OUT/swiglu-sweep-$r.json" 2>&1 | grep "a step"
done
