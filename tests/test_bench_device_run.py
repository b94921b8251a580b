"""bench/device_run.sh, the preamble and helpers the device scripts source: $OUT made and
made absolute (the scripts move on into bench/), the repository root as the working folder,
this tree first on PYTHONPATH with what was there kept in BASE, and gpu_tests / sanitize
writing their logs under $OUT. compute-sanitizer is a stand-in here (no GPU)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
. "{repo}/bench/device_run.sh"
echo "OUT=$OUT"
echo "PWD=$PWD"
echo "PYTHONPATH=$PYTHONPATH"
echo "BASE=$BASE"
(cd bench && sanitize probe python3 -c "print('ran in', __import__('os').getcwd())")
"""


def test_preamble_and_sanitize_write_under_an_absolute_out(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"  # runs the command, then prints a summary as the tool
    fake.write_text('#!/usr/bin/env bash\ntool=$2; shift 2; "$@"\n'
                    'echo "========= $tool SUMMARY: 0 errors"\n')
    fake.chmod(0o755)
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT.format(repo=REPO))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": "out/here",
           "PYTHONPATH": "/elsewhere"}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line
                 and not line.startswith("="))
    out = tmp_path / "out" / "here"
    assert lines["OUT"] == str(out) and out.is_dir()  # relative to the caller, made absolute
    assert lines["PWD"] == str(REPO)
    assert lines["PYTHONPATH"] == f"{REPO}:/elsewhere" and lines["BASE"] == "/elsewhere"
    for tool in ("memcheck", "racecheck"):
        log = (out / f"probe-{tool}.log").read_text()
        assert f"ran in {REPO / 'bench'}" in log and f"{tool} SUMMARY" in log
    assert done.stdout.count("SUMMARY: 0 errors") == 2  # each tool's last line shown


def test_an_unset_out_stops_the_script_by_name(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(f'. "{REPO}/bench/device_run.sh"\necho reached\n')
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "reached" not in done.stdout
    assert "set OUT to a directory" in done.stderr
