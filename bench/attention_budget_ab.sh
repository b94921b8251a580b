#!/usr/bin/env bash
# The scheduler's attention budget (CRUCIBLE_ATTENTION_BUDGET, engine/scheduler.py) on the
# GPU: #17's chat bench (serve's budget and graph rows, one round a process) and #16's chat
# mix at 256 streaming clients, under each budget in BUDGETS (0: off), in fresh processes,
# the order reversed every other round; then bench/attention_budget_report.py's table.
#
#     OUT=/some/dir MODEL=/path/smollm2.gguf [BUDGETS="0 262144 524288"] [ROUNDS=2]
#         [SERVE_ROUNDS=1] bash bench/attention_budget_ab.sh        # ~4.5 min at the defaults
BUDGETS=${BUDGETS:-0 262144 524288}
ROUNDS=${ROUNDS:-2}
SERVE_ROUNDS=${SERVE_ROUNDS:-1}
MODEL=${MODEL:?set MODEL to the default model GGUF}
. "$(dirname "$0")/device_run.sh"
order() {  # the budgets, reversed in even rounds
    if [ $(($1 % 2)) -eq 1 ]; then echo $BUDGETS; else echo $BUDGETS | tr ' ' '\n' | tac; fi
}
for r in $(seq 1 "$ROUNDS"); do
    for b in $(order "$r"); do
        CRUCIBLE_ATTENTION_BUDGET=$b CRUCIBLE_MIXED_GRAPH_ROWS=1024 python3 \
            bench/prefix_cache_bench.py --model "$MODEL" --device cuda --workload chat \
            --rounds 1 --token-budget 1024 --json "$OUT/chat-$b-$r.json" \
            > "$OUT/chat-$b-$r.log" 2>&1 || echo "chat $b round $r failed"
    done
done
for r in $(seq 1 "$SERVE_ROUNDS"); do
    for b in $(order "$r"); do
        CRUCIBLE_ATTENTION_BUDGET=$b python3 bench/serve_clients.py --model "$MODEL" \
            --device cuda --mix chat --clients 256 --seconds 12 --ramp-seconds 2 \
            --settle-seconds 3 --warmup-seconds 5 --warmup-clients 256 --rounds 1 \
            --no-engine-batch1 --plot none --json "$OUT/serve-$b-$r.json" \
            > "$OUT/serve-$b-$r.log" 2>&1 || echo "serve $b round $r failed"
    done
done
python3 bench/attention_budget_report.py "$OUT" --json "$OUT/attention-budget-ab.json"
