"""The first minute on this machine: the first `llm-engine generate` with an empty model
cache (download, extraction, checksum, the prepared-model cache written), then warm starts.

    python3 bench/first_start.py [--llm-engine PATH] [--warm 3] [--json PATH]

Each start is ``llm-engine generate --prompt Hello --max-tokens 1`` in a fresh process,
timed end to end (process start to exit) with ``CRUCIBLE_CACHE`` pointing at a new empty
directory, so the first run fetches the default model. ``--llm-engine`` picks the
executable (e.g. a fresh virtual environment's, to time the first start after a fresh
install). Targets (issue "The first minute"): first start <= 15 s with progress shown,
warm start to first token <= 1.5 s on the CPU. The stderr lines of every run are kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import stat, write_json


def start(exe: str, cache: str) -> tuple[float, str]:
    env = dict(os.environ, CRUCIBLE_CACHE=cache, PIP_NO_CACHE_DIR="1")
    t = time.perf_counter()
    done = subprocess.run([exe, "generate", "--prompt", "Hello", "--max-tokens", "1"],
                          env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"llm-engine failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done.stderr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llm-engine", default=shutil.which("llm-engine") or "llm-engine")
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--json", default="bench/first-start-cpu.json")
    args = p.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="crucible-first-")
    try:
        first, first_err = start(args.llm_engine, cache)
        warm = [start(args.llm_engine, cache) for _ in range(args.warm)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    # Progress lines end with \r while they update: keep the last state of each.
    # (the temporary cache's path is written as $CRUCIBLE_CACHE: no machine's paths kept).
    lines = [ln.split("\r")[-1].replace(cache, "$CRUCIBLE_CACHE")
             for ln in first_err.splitlines()]
    write_json(args.json, {
        "command": "python3 bench/first_start.py " + " ".join(argv if argv is not None
                                                              else sys.argv[1:]),
        "cpus": os.cpu_count(),
        "first_start_s": round(first, 3), "first_start_target_s": 15.0,
        "warm_start_s": stat([w for w, _ in warm]), "warm_start_target_s": 1.5,
        "first_stderr": [ln for ln in lines if ln.startswith(("crucible", "["))],
        "warm_stderr": warm[-1][1].splitlines()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
