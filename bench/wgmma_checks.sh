#!/usr/bin/env bash
# The warpgroup-MMA GEMM's GPU checks, in the order they gate each other (docs/throughput.md,
# "The warpgroup MMA"); eight files under OUT (the device machine returns about that many). About five minutes on an
# H200 (plus the exactness checks') with random weights: no model needed.
#
#     OUT=/some/dir bash bench/wgmma_checks.sh
#
# 1. bench/wgmma_probe.py: does wgmma sum a step as mma.sync does (and which reading of the
#    descriptor's offsets is the hardware's; can NVRTC build wgmma for sm_90a)?
# 2. tests/test_gpu_linear_wgmma.py: cuda/linear_wgmma.cu against linear_mma, bit for bit.
# 3. compute-sanitizer memcheck and racecheck over bench/wgmma_gemm.py --quick.
# 4. bench/wgmma_gemm.py: bits, float64 error and speed of every wgmma kernel against
#    linear_mma at the model's four layer shapes.
# 5. gpu-graph-check, gpu-batch and gpu-packed-prefill-check under CRUCIBLE_WGMMA=1.
. "$(dirname "$0")/device_run.sh"
LOGS=$(mktemp -d)  # the benches' progress lines: their JSON holds the figures
python3 bench/wgmma_probe.py --json "$OUT/wgmma-probe-h200.json" > "$LOGS/probe.log" 2>&1
tail -12 "$LOGS/probe.log"
python3 -m pytest -q tests/test_gpu_linear_wgmma.py > "$OUT/wgmma-tests-h200.log" 2>&1
tail -2 "$OUT/wgmma-tests-h200.log"
for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" python3 bench/wgmma_gemm.py --quick \
        > "$OUT/wgmma-$tool-h200.log" 2>&1
    tail -1 "$OUT/wgmma-$tool-h200.log"
done
python3 bench/wgmma_gemm.py --json "$OUT/wgmma-gemm-h200.json" > "$LOGS/gemm.log" 2>&1
tail -30 "$LOGS/gemm.log"
# 5. The exactness checks with the kernels routed (their tiny model's shapes all fit them):
#    graph replay == eager, a request alone == inside batches, packed == one at a time.
for check in gpu-graph-check gpu-batch gpu-packed-prefill-check; do
    CRUCIBLE_WGMMA=1 python3 -m crucible "$check" > "$OUT/wgmma-$check-h200.log" 2>&1
    tail -2 "$OUT/wgmma-$check-h200.log"
done
