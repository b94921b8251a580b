#!/usr/bin/env bash
# The GPU evidence of docs/gpu-engine.md, in one run on the GPU machine (from the repo root).
#   bash scripts/gpu_evidence.sh [MODEL.gguf]
# Without a model: the exactness suite on tiny random models, the per-kernel bench and the
# tensor-core GEMM's checks (CRUCIBLE_GEMM=mma). With
# the default model's GGUF: also the speed bench, perplexity (int8 and f32), the HF peer and
# the full-size packed check (over 5 minutes on its own).
# Logs and JSON go to $OUT (default: ./gpu-out). Copy what a doc quotes into bench/.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
run() {  # name, command...: log to $out/name.log; a failure is reported, the rest still runs
    local name="$1"; shift
    "$@" > "$out/$name.log" 2>&1 || { echo "FAILED: $name (see $out/$name.log)"; status=1; }
    tail -n 1 "$out/$name.log"
}
run gpu-validate python3 -m crucible gpu-validate
run gpu-kernels python3 bench/gpu_kernels.py --json "$out/gpu-kernels.json"
# The tensor-core GEMM order (CRUCIBLE_GEMM=mma): its kernels' bits and speed, and the
# exactness checks with every int8 GEMM in that order.
run gemm-mma python3 bench/gemm_mma_bench.py --json "$out/gemm-mma.json"
run mma-fused python3 bench/mma_fused_bench.py --json "$out/mma-fused.json"
run mma-tests python3 -m pytest -q tests/test_gpu_linear_mma.py tests/test_gpu_mma_fused.py \
    tests/test_gpu_pdl_chain.py
# (scripts/sanitize_mma.py --one-row: only the one-row forms, for a short lease.)
for tool in memcheck racecheck; do
    run "mma-$tool" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        python3 scripts/sanitize_mma.py
done
# The batch-1 decode stack under both orders (its MMA forms against the mma stages).
run stack-tests python3 -m pytest -q tests/test_gpu_engine.py -k decode_stack
for tool in memcheck racecheck; do
    run "stack-$tool" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        python3 scripts/sanitize_stack.py
done
for check in gpu-graph-check gpu-packed-prefill-check gpu-batch gpu-paged; do
    run "mma-$check" env CRUCIBLE_GEMM=mma python3 -m crucible "$check"
done
if [ $# -ge 1 ]; then
    model="$1"
    run gpu-generate python3 bench/gpu_generate.py --model "$model" --weights int8 --rounds 3 \
        --json "$out/gpu-generate-int8.json"
    run gpu-generate-mma python3 bench/gpu_generate.py --model "$model" --gemm mma \
        --rounds 2 --parts decode,engine --json "$out/gpu-generate-mma.json"
    # The LM head on the tile kernel at one row (ROW1_ROUTED off) against the line above.
    run gpu-generate-mma-tile-head python3 bench/gpu_generate.py --model "$model" --gemm mma \
        --row1-head 0 --rounds 2 --parts decode,engine --json "$out/gpu-generate-mma-tile-head.json"
    for w in int8 f32; do
        run "gpu-eval-$w" python3 -m crucible gpu-eval --model "$model" --weights "$w" \
            --device cuda --paged --compare-attn reference --json "$out/gpu-eval-$w.json"
    done
    run hf-peer python3 bench/hf_peer.py --model "$model" --weights f32 --batches 1,32 \
        --json "$out/hf-peer.json"
    # The full-size packed check on the default model runs past 285 s: give it its own
    # command (10 minutes); its stderr reports progress after each stage.
    run packed-full timeout 590 python3 -m crucible gpu-packed-prefill-check --model "$model" \
        --steps 16 --fuzz 24
fi
exit $status
