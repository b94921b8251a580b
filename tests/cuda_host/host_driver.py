"""Build and run a tests/cuda_host driver: a kernel's own CUDA source compiled for the CPU
with prelude.h (g++, C++20 for std::barrier, no fp contraction so every rounding is the
source's own). Shared by the host-run kernel tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
import pytest

from crucible.kernels.source import cuda_source_dir

HERE = Path(__file__).resolve().parent


def build(driver: str, out_dir: Path) -> Path:
    """Compile ``driver`` (a .cpp here) into ``out_dir``; skips without g++ or std::barrier."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not on PATH")
    exe = out_dir / Path(driver).stem
    r = subprocess.run([cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-w", "-pthread",
                        f"-I{HERE}", f"-I{cuda_source_dir()}", str(HERE / driver),
                        "-o", str(exe)], capture_output=True, text=True, timeout=600)
    if r.returncode and "barrier" in r.stderr:
        pytest.skip("the C++ library lacks std::barrier (C++20)")
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def run(exe: Path, *args: str) -> tuple[int, int, int, str]:
    """(exit code, runs, failed runs, stdout) of a driver's "N runs, F failed" summary."""
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    m = re.search(r"(\d+) runs, (\d+) failed", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    return r.returncode, int(m.group(1)), int(m.group(2)), r.stdout
