#!/usr/bin/env bash
# Which decode row counts the SwiGLU epilogue loses at (branch exp/wgmma-swiglu). On an
# H100 its 256-row decode graph replayed 1.066x main's time while 128, 192, 384 and 512
# rows ran 0.965-0.982x (bench/wgmma-swiglu-ab-h100.json), and only with PDL on: the loss
# is in how it overlaps the down GEMM launched after it. This sweeps the rows around 256
# (each a grid of 48 x ceil(M / 64) CTAs) so a route can leave out the ones that lose.
# Random weights, no model; about four minutes.
#
#     OUT=/some/dir MAIN=/dir/with/main/unpacked [ROWS="160 224 ..."] bash bench/wgmma_swiglu_sweep.sh
set -u
OUT=${OUT:?set OUT to a directory for the results}
MAIN=${MAIN:?set MAIN to main unpacked (git archive main | tar -x -C DIR)}
ROWS=${ROWS:-"160 224 240 256 272 288 320 448"}
cd "$(dirname "$0")/.."
BASE=${PYTHONPATH:-}  # what else the machine needs on the path, for both sides
mkdir -p "$OUT"
for r in $ROWS; do
    python3 bench/env_ab.py --a-cwd "$MAIN/bench" --b-cwd "$PWD/bench" \
        --a "PYTHONPATH=$MAIN${BASE:+:$BASE}" --b "PYTHONPATH=$PWD${BASE:+:$BASE}" \
        --rounds 2 --drop-runs --json "$OUT/swiglu-sweep-$r.json" \
        --metric results.whole.step_ms.median -- \
        python3 launch_bound.py --rows "$r" --kinds whole --rounds 3 --json {json} 2>&1 \
        | tail -1 | sed "s/^/rows $r: /"
done
