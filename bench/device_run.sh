# device_run.sh: what the device scripts (bench/*_checks.sh, chat_evidence.sh, ncu_*.sh, ...)
# share, sourced as their first step after their own settings:
#
#     . "$(dirname "$0")/device_run.sh"
#
# It stops on unset variables, makes $OUT and turns it into an absolute path (the scripts
# move to the repository root and often on into bench/), moves to the repository root and
# puts this tree first on PYTHONPATH. BASE keeps what the machine had on PYTHONPATH before
# (the gguf wheel's folder, for one), for scripts that run a second tree beside this one.
# Then two helpers for the checks every changed kernel gets before it is merged.
set -u
OUT=${OUT:?set OUT to a directory for the results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BASE=${PYTHONPATH:-}
export PYTHONPATH=$PWD${BASE:+:$BASE}

# gpu_tests NAME TEST_FILE...: the tests into $OUT/NAME-tests.log; shows pytest's last lines.
gpu_tests() {
    local name=$1
    shift
    python3 -m pytest -q "$@" > "$OUT/$name-tests.log" 2>&1
    tail -2 "$OUT/$name-tests.log"
}

# sanitize NAME COMMAND...: COMMAND under compute-sanitizer's memcheck, then racecheck, into
# $OUT/NAME-memcheck.log and $OUT/NAME-racecheck.log; shows each summary line.
sanitize() {
    local name=$1 tool
    shift
    for tool in memcheck racecheck; do
        compute-sanitizer --tool "$tool" "$@" > "$OUT/$name-$tool.log" 2>&1
        tail -1 "$OUT/$name-$tool.log"
    done
}
