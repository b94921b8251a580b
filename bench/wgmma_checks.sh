#!/usr/bin/env bash
# The warpgroup-MMA GEMM's GPU checks, in the order they gate each other (docs/throughput.md,
# "The warpgroup MMA"); each writes its log (and JSON) under OUT. About five minutes on an
# H200 with random weights: no model needed.
#
#     OUT=/some/dir bash bench/wgmma_checks.sh
#
# 1. bench/wgmma_probe.py: does wgmma sum a step as mma.sync does (and which reading of the
#    descriptor's offsets is the hardware's; can NVRTC build wgmma for sm_90a)?
# 2. tests/test_gpu_linear_wgmma.py: cuda/linear_wgmma.cu against linear_mma, bit for bit.
# 3. compute-sanitizer memcheck and racecheck over bench/wgmma_gemm.py --quick.
# 4. bench/wgmma_gemm.py: bits, float64 error and speed of every wgmma kernel against
#    linear_mma at the model's four layer shapes.
set -u
OUT=${OUT:?set OUT to a directory for the logs}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
python3 bench/wgmma_probe.py --json "$OUT/wgmma-probe-h200.json" > "$OUT/wgmma-probe-h200.log" 2>&1
tail -2 "$OUT/wgmma-probe-h200.log"
python3 -m pytest -q tests/test_gpu_linear_wgmma.py > "$OUT/wgmma-tests-h200.log" 2>&1
tail -2 "$OUT/wgmma-tests-h200.log"
for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" python3 bench/wgmma_gemm.py --quick \
        > "$OUT/wgmma-$tool-h200.log" 2>&1
    tail -1 "$OUT/wgmma-$tool-h200.log"
done
python3 bench/wgmma_gemm.py --json "$OUT/wgmma-gemm-h200.json" > "$OUT/wgmma-gemm-h200.log" 2>&1
tail -30 "$OUT/wgmma-gemm-h200.log"
