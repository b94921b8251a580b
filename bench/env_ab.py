"""One bench, two settings of environment variables, alternated in fresh processes.

A switch (``CRUCIBLE_MIXED_GRAPH_ROWS=1024``, ``CRUCIBLE_LATE_PLANNING=1``) is judged by the
bench it is meant to move, run once per round with each setting in its own process, in the
order A B, B A, A B, ... so drift over the lease falls on both sides. Each run writes its own
JSON (the command's ``{json}`` is replaced by that run's path); the figures named by
``--metric`` are read from it and reported per run, with the paired ratio B/A per round
(median, min-max):

    python3 bench/env_ab.py --a CRUCIBLE_MIXED_GRAPH_ROWS=512 --b CRUCIBLE_MIXED_GRAPH_ROWS=1024 \
        --rounds 2 --metric total_tok_per_s --json bench/x.json -- \
        python3 bench/throughput.py --model M --device cuda --plot none --json {json}

A metric is a dotted path into the run's JSON: a dict key, a list index, or ``key=value``
choosing the list element whose ``key`` equals ``value`` (``levels.clients=256.tok_per_s``).
The runs' JSON and logs go to a folder beside ``--json`` (its name less the suffix);
``--drop-runs`` removes it once every run passed, leaving the one summary (a GPU machine
that sends back only a few files a command).

Two trees instead of two settings: ``--a-cwd DIR`` / ``--b-cwd DIR`` run that side's command
in DIR, so a relative ``bench/x.py`` is that tree's bench, which imports that tree's
``crucible`` and compiles its ``cuda/`` (give the side ``PYTHONPATH=DIR`` too where a bench
takes ``crucible`` from the path). A branch's tree against main's, for example, with main
unpacked by ``git archive main | tar -x -C /some/dir``:

    python3 bench/env_ab.py --a PYTHONPATH=/some/dir --a-cwd /some/dir --rounds 2 \
        --metric ratios.ttft_p50_off_over_on.median --json bench/x.json -- \
        python3 bench/prefix_cache_bench.py --model M --device cuda --workload chat --json {json}
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"env_ab: {item!r} is not NAME=VALUE")
        env[key] = value
    return env


def pick(doc: Any, path: str) -> Any:
    """The figure at ``path`` (see the module's doc); KeyError naming the missing step."""
    for step in path.split("."):
        if isinstance(doc, list) and "=" in step:
            key, _, want = step.partition("=")
            found = [x for x in doc if isinstance(x, dict) and str(x.get(key)) == want]
            if not found:
                raise KeyError(f"{path}: no element with {key} = {want}")
            doc = found[0]
        elif isinstance(doc, list):
            doc = doc[int(step)]
        elif isinstance(doc, dict) and step in doc:
            doc = doc[step]
        else:
            raise KeyError(f"{path}: no {step!r}")
    return doc


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def run_once(cmd: list[str], env: dict[str, str], out: Path, log: Path,
             cwd: Path | None = None) -> dict:
    argv = [out.as_posix() if a == "{json}" else a.replace("{json}", out.as_posix()) for a in cmd]
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(argv, env=dict(os.environ, **env), stdout=f, cwd=cwd,
                            stderr=subprocess.STDOUT).returncode
    doc = json.loads(out.read_text()) if out.exists() else {}
    return {"rc": rc, "wall_s": round(time.perf_counter() - t0, 1), "doc": doc}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", nargs="*", default=[], help="NAME=VALUE of setting A (the baseline)")
    p.add_argument("--b", nargs="*", default=[], help="NAME=VALUE of setting B")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--metric", action="append", required=True)
    p.add_argument("--a-cwd", type=Path, help="the directory A's command runs in")
    p.add_argument("--b-cwd", type=Path, help="the directory B's command runs in")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--drop-runs", action="store_true",
                   help="remove the per-run folder when every run passed")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the bench, with {json}")
    args = p.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd or not any("{json}" in a for a in cmd):
        raise SystemExit("env_ab: the command must contain {json}")
    envs = {"a": parse_env(args.a), "b": parse_env(args.b)}
    cwds = {"a": args.a_cwd, "b": args.b_cwd}
    for side, d in cwds.items():
        if d is not None and not d.is_dir():
            raise SystemExit(f"env_ab: --{side}-cwd {d} is not a directory")
    args.json = args.json.resolve()  # {json} must mean the same file from either directory
    work = args.json.with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    failed = False
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            stem = work / f"{side}{r}"
            res = run_once(cmd, envs[side], stem.with_suffix(".json"), stem.with_suffix(".log"),
                           cwds[side])
            figures = {}
            for m in args.metric:
                try:
                    figures[m] = pick(res["doc"], m)
                except (KeyError, IndexError, ValueError) as e:
                    figures[m], failed = None, True
                    print(f"env_ab: round {r} {side}: {e}", file=sys.stderr)
            failed |= res["rc"] != 0
            runs[side].append({"round": r, "rc": res["rc"], "wall_s": res["wall_s"], **figures})
            print(f"round {r} {side} rc={res['rc']} {res['wall_s']}s {figures}", flush=True)
    ratios = {}
    for m in args.metric:
        pairs = [(a[m], b[m]) for a, b in zip(runs["a"], runs["b"])
                 if isinstance(a[m], (int, float)) and isinstance(b[m], (int, float)) and a[m]]
        if pairs:
            ratios[m] = {"per_round": [round(b / a, 4) for a, b in pairs],
                         **{k: round(v, 4) for k, v in spread([b / a for a, b in pairs]).items()}}
    result = {"bench": "env_ab", "command": "python3 " + shlex.join(sys.argv),
              "a": envs["a"], "b": envs["b"],
              "cwd": {k: None if d is None else str(d) for k, d in cwds.items()},
              "order": "a b, b a, ... (fresh process each)",
              "runs": runs, "ratio_b_over_a": ratios}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.drop_runs and not failed:  # a failed run's log stays to be read
        shutil.rmtree(work)
    for m, r in ratios.items():
        print(f"{m}: B/A {r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}]")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
