#!/usr/bin/env bash
# attn_exact_pf's GPU checks (the prefetching instance of the exact tiled attention,
# cuda/attention_prefetch.cuh; docs/attention.md), in the order they gate each other.
# Random data and random weights: no model needed. About four minutes.
#
#     OUT=/some/dir bash bench/prefetch_checks.sh
#     OUT=/some/dir ALT=other/cuda/attention.cu bash bench/prefetch_checks.sh
#
# ALT: another tree's attention.cu (its includes from its own directory), timed beside the
# shipped instances in step 3 as "alt" and "alt-pf" (a branch's kernel against main's).
#
# 1. tests/test_attention_gpu.py: every variant against the reference, and the new test's
#    chat-like launches with variants.PREFETCH on and off, bit for bit.
# 2. compute-sanitizer memcheck and racecheck over bench/prefill_attention.py --prefetch on
#    one chat-like shape (both instances, one round).
# 3. bench/prefill_attention.py --prefetch: both instances' time and bits on two chat
#    launches (capacity 1,792) and three shapes at capacities up to 1,024.
# 4. bench/capacity_classes.py: the mixed, decode and prefill graphs' replays under every
#    rule, the prefetching instance among them ("prefetch").
. "$(dirname "$0")/device_run.sh"
gpu_tests prefetch tests/test_attention_gpu.py
sanitize prefetch python3 bench/prefill_attention.py --prefetch --shapes chat-joiner-1400 \
    --rounds 1
python3 bench/prefill_attention.py --prefetch --rounds 7 ${ALT:+--alt "alt=$ALT"} \
    --shapes chat-cohort-1300,chat-joiner-1400,history-64-at-960,history-64-at-512,single-1024 \
    --json "$OUT/prefetch-attention.json"
python3 bench/capacity_classes.py --rounds 3 --replays 20 \
    --json "$OUT/capacity-classes.json" 2>&1 | tail -12
