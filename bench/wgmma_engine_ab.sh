#!/usr/bin/env bash
# The engine with CRUCIBLE_WGMMA=0 against =1, alternating in fresh processes
# (bench/env_ab.py), once bench/wgmma_checks.sh has shown the kernel gives linear_mma's
# bits: the random 1,000-request workload (#15's 80,000 tok/s) and 256 and 512 streaming
# clients (#16's 30,000 tok/s), the default model, int8, library defaults; first the
# engine's batch-1 and batch-64 decode (bench/gpu_generate.py, mma with and without
# --wgmma, alternating), which the routing must leave as they were.
#
#     OUT=/some/dir MODEL=/path/to/smollm2.gguf bash bench/wgmma_engine_ab.sh
#
# About four minutes on an H200. Each A/B leaves its JSON under OUT.
MODEL=${MODEL:?set MODEL to the path of the default model GGUF}
. "$(dirname "$0")/device_run.sh"
i=0
for w in "" --wgmma --wgmma ""; do
    i=$((i + 1))
    python3 bench/gpu_generate.py --model "$MODEL" --gemm mma $w --rounds 2 --parts engine \
        --json "$OUT/wgmma-generate-$i${w:+-wgmma}.json" > /dev/null 2>&1
    python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['results']
print(sys.argv[2] or 'mma', {k: round(v['median']) for k, v in r.items() if 'engine' in k})" \
        "$OUT/wgmma-generate-$i${w:+-wgmma}.json" "$w"
done
python3 bench/env_ab.py --a CRUCIBLE_WGMMA=0 --b CRUCIBLE_WGMMA=1 --rounds 2 \
    --metric summary.total_tok_per_s.median --metric summary.output_tok_per_s.median \
    --metric probes.0.identical --json "$OUT/wgmma-throughput-h200.json" \
    --drop-runs -- python3 bench/throughput.py --model "$MODEL" --device cuda --plot none \
    --json '{json}'
python3 bench/env_ab.py --a CRUCIBLE_WGMMA=0 --b CRUCIBLE_WGMMA=1 --rounds 2 \
    --metric levels.clients=256.tok_per_s --metric levels.clients=512.tok_per_s \
    --metric levels.clients=256.gap_p50_ms --metric levels.clients=256.ttft_p50_ms \
    --metric levels.clients=256.errors --metric levels.clients=512.errors \
    --json "$OUT/wgmma-serve-h200.json" --drop-runs -- python3 bench/serve_clients.py \
    --model "$MODEL" --device cuda --mix issue --clients 256,512 --seconds 6 \
    --ramp-seconds 1 --warmup-seconds 4 --no-engine-batch1 --plot none --json '{json}'
