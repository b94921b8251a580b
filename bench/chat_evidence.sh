#!/usr/bin/env bash
# The device runs that #16's chat-mix sweep and #17's chat TTFT need, in three parts that
# fit the device's 10 minutes a command (the model takes two back-to-back runs to arrive:
# part a needs no model, so it rides with the first).
#
#     OUT=/some/dir PART=a bash bench/chat_evidence.sh                  # ~3 min, no model
#     OUT=/some/dir PART=b MODEL=/path/smollm2.gguf bash bench/chat_evidence.sh   # ~8 min
#         (MIX=chat: the chat mix alone, ~4.5 min; CLIENTS=256,512 with it: ~2 min, the
#         levels #16's targets name, for a lease with little time left)
#     OUT=/some/dir PART=c MODEL=/path/smollm2.gguf bash bench/chat_evidence.sh   # ~4.5 min
#     OUT=/some/dir PART=ab MODEL=... TREE=/baseline/tree bash bench/chat_evidence.sh  # ~4 min
#     OUT=/some/dir PART=bc MODEL=... bash bench/chat_evidence.sh   # ~7 min: b at the chat
#         mix's 256 and 512 clients, then c (an H200 lease's one run after the model came)
#     OUT=/some/dir PART=inproc MODEL=... TREE=/baseline/tree bash bench/chat_evidence.sh
#         # ~4 min
#     OUT=/some/dir PART=rows MODEL=... bash bench/chat_evidence.sh   # ~3.5 min
#     OUT=/some/dir PART=short MODEL=... bash bench/chat_evidence.sh   # ~3.5 min: #16's
#         256-client chat level and #17's chat bench (c's first part, PART=chat alone), for
#         a lease with little device time left
#
# a: a mixed graph capture's host time by part (bench/capture_parts.py), the graphs'
#    memory bound under the chat mix (bench/graph_memory_check.py, random weights), then
#    the capacity classes against powers of two and the spread rule
#    (bench/capacity_classes.py, ~1.5 min).
# b: the serving sweep under the defaults on the issue and chat mixes, steady state
#    (12-second windows after a 3-second settle, two rounds; docs/serving.md).
# c: the prefix cache's chat bench at serve's budget and graph rows (3 rounds, the
#    warm-up as long as the conversations), its misses-only bench at the defaults (1,024
#    unique prompts, 3 rounds), then one turn's timeline. WARMUP_PASSES: the chat
#    warm-up's sets (prefix_cache_bench.py --warmup-passes; 1 unless set). Its JSON counts
#    the requests that waited out a graph's first use and gives the TTFT p50 of the others
#    (ttft_with_first_use, ttft_p50_ms_no_first_use: trees since 32913b2; PART=ab leaves
#    them out, since a baseline without them would fail every run).
# ab: the chat bench (c's first part, one round a process) against the tree in TREE (e.g.
#    `git archive REV crucible cuda bench pyproject.toml | tar -x -C DIR`), fresh processes
#    alternating (bench/env_ab.py), ROUNDS rounds (6 unless set): TTFT p50 and p99 on and
#    off, their ratio, total tok/s, and the mixed captures inside the timed turns.
# rows: LLM's mixed-graph rows, its 512 against serve's 1,024, on the miss workload and the
#    random 1,000 requests, fresh processes alternating, ROUNDS rounds (3 unless set; ~3.5
#    min): whether LLM's default should follow serve's (docs/throughput.md, "Eager steps'
#    host time on a GPU host").
# inproc: the chat mix at 256 streaming clients against the server with its engine in
#    process (AsyncLLMEngine, whose worker waits for the loop's answers), this tree against
#    TREE, fresh servers alternating, ROUNDS rounds (2 unless set): output tok/s, TTFT p50,
#    gap p50, errors.
PART=${PART:?set PART to a, b, c, chat, ab, bc, short or inproc}
if [ "$PART" = bc ]; then  # b's chat levels, then c, in one run
    MIX=chat CLIENTS=256,512 PART=b bash "$0" && PART=c exec bash "$0"
    exit 1
fi
if [ "$PART" = short ]; then  # the two target figures alone: 256 chat clients, the chat bench
    MIX=chat CLIENTS=256 PART=b bash "$0" && PART=chat exec bash "$0"
    exit 1
fi
. "$(dirname "$0")/device_run.sh"
case "$PART" in
a)
    python3 bench/capture_parts.py --rounds 3 --json "$OUT/capture-parts.json" \
        > "$OUT/capture-parts.log" 2>&1
    tail -20 "$OUT/capture-parts.log"
    (cd bench && python3 graph_memory_check.py --requests 1000 --rounds 3 \
        --json "$OUT/graph-memory-check.json" 2>&1 | tail -3)
    python3 bench/capacity_classes.py --rounds 3 --replays 20 \
        --json "$OUT/capacity-classes.json" 2>&1 | tail -10 ;;
b)
    MODEL=${MODEL:?set MODEL to the default model GGUF}
    python3 bench/serve_clients.py --model "$MODEL" --device cuda --mix "${MIX:-issue,chat}" \
        --clients "${CLIENTS:-1,16,64,256,512}" --seconds 12 --ramp-seconds 2 --settle-seconds 3 \
        --warmup-seconds 5 --warmup-clients 512 --rounds 2 --plot none \
        --json "$OUT/serve-sweep.json" > "$OUT/serve-sweep.log" 2>&1
    tail -30 "$OUT/serve-sweep.log" ;;
c|chat)
    MODEL=${MODEL:?set MODEL to the default model GGUF}
    CRUCIBLE_MIXED_GRAPH_ROWS=1024 python3 bench/prefix_cache_bench.py --model "$MODEL" \
        --device cuda --workload chat --rounds 3 --token-budget 1024 \
        --warmup-passes "${WARMUP_PASSES:-1}" \
        --json "$OUT/prefix-chat.json" > "$OUT/prefix-chat.log" 2>&1
    tail -12 "$OUT/prefix-chat.log"
    [ "$PART" = chat ] && exit 0
    # #17's other benchmark: unique prompts only, the cache on within 2% of off. 1,024
    # requests (~10 s a config) where the default 256 ran ~3 s and moved +-10% between runs.
    python3 bench/prefix_cache_bench.py --model "$MODEL" --device cuda --workload miss \
        --rounds 3 --miss-requests 1024 --json "$OUT/prefix-miss.json" \
        > "$OUT/prefix-miss.log" 2>&1
    tail -8 "$OUT/prefix-miss.log"
    CRUCIBLE_MIXED_GRAPH_ROWS=1024 python3 bench/chat_timeline.py --model "$MODEL" \
        --device cuda --turns 8 --json "$OUT/chat-timeline.json" 2>&1 | head -30 ;;
ab)
    MODEL=${MODEL:?set MODEL to the default model GGUF}
    TREE=${TREE:?set TREE to the baseline tree}
    m=summary.chat
    CRUCIBLE_MIXED_GRAPH_ROWS=1024 python3 bench/env_ab.py \
        --a "PYTHONPATH=$TREE${BASE:+:$BASE}" --a-cwd "$TREE" --b "PYTHONPATH=$PYTHONPATH" \
        --rounds "${ROUNDS:-6}" --metric ratios.ttft_p50_off_over_on.median \
        --metric $m.on.ttft_p50_ms.median --metric $m.off.ttft_p50_ms.median \
        --metric $m.on.ttft_p99_ms.median --metric $m.off.ttft_p99_ms.median \
        --metric $m.on.total_tok_per_s.median \
        --metric runs.chat.config=on.figures.graphs.mixed_captures --drop-runs \
        --json "$OUT/chat-ab.json" -- python3 bench/prefix_cache_bench.py --model "$MODEL" \
        --device cuda --workload chat --rounds 1 --token-budget 1024 \
        --warmup-passes "${WARMUP_PASSES:-1}" --json '{json}' > "$OUT/chat-ab.log" 2>&1
    tail -9 "$OUT/chat-ab.log" ;;
inproc)
    MODEL=${MODEL:?set MODEL to the default model GGUF}
    TREE=${TREE:?set TREE to the baseline tree}
    l=levels.0
    python3 bench/env_ab.py --a "PYTHONPATH=$TREE${BASE:+:$BASE}" --a-cwd "$TREE" \
        --b "PYTHONPATH=$PYTHONPATH" --rounds "${ROUNDS:-2}" --metric $l.tok_per_s \
        --metric $l.ttft_p50_ms --metric $l.gap_p50_ms --metric $l.errors \
        --metric $l.engine.ms_per_step --drop-runs --json "$OUT/inproc-ab.json" -- \
        python3 bench/serve_clients.py --model "$MODEL" --device cuda --mix chat \
        --clients 256 --seconds 12 --ramp-seconds 2 --settle-seconds 3 --warmup-seconds 5 \
        --warmup-clients 256 --engine-in-process --no-engine-batch1 --plot none \
        --json '{json}' > "$OUT/inproc-ab.log" 2>&1
    tail -6 "$OUT/inproc-ab.log" ;;
rows)
    MODEL=${MODEL:?set MODEL to the default model GGUF}
    # LLM's mixed-graph rows, 512 (its default) against 1,024 (serve's), on #17's misses
    # and #15's random 1,000 requests, fresh processes alternating
    for w in miss tput; do
        if [ $w = miss ]; then
            metrics="--metric ratios.miss_tok_per_s_on_over_off.median
                --metric summary.miss.on.total_tok_per_s.median
                --metric summary.miss.off.total_tok_per_s.median"
            run="python3 bench/prefix_cache_bench.py --model $MODEL --device cuda
                --workload miss --rounds 1 --miss-requests 1024 --json {json}"
        else
            metrics="--metric summary.total_tok_per_s.median
                --metric summary.captures_in_timed_run.median"
            run="python3 bench/throughput.py --model $MODEL --device cuda --plot none
                --probes 0 --json {json}"
        fi
        python3 bench/env_ab.py --a CRUCIBLE_MIXED_GRAPH_ROWS=512 \
            --b CRUCIBLE_MIXED_GRAPH_ROWS=1024 --rounds "${ROUNDS:-3}" $metrics --drop-runs \
            --json "$OUT/rows-$w-ab.json" -- $run > "$OUT/rows-$w-ab.log" 2>&1
        tail -4 "$OUT/rows-$w-ab.log"
    done ;;
*)
    echo "PART must be a, b, c, chat, ab, bc, short, rows or inproc" >&2; exit 2 ;;
esac
