"""cuda/linear_chunks.cu's own source run on the CPU (tests/cuda_host/prelude.h maps the CUDA
it uses onto std::thread and std::barrier) against a plain spelling of the canonical order,
bitwise, for every instantiation over shapes with N and K tails and M = 1..64; and the
negative control: a reference that adds the chunk partials in descending order must not
match. Checks the kernel's index arithmetic without a GPU; the GPU's memory system (fences,
L2 reads, PDL) is gpu-engine-check's job."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from crucible.kernels.source import cuda_source_dir

HERE = Path(__file__).resolve().parent / "cuda_host"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not on PATH")
    exe = tmp_path_factory.mktemp("chunks") / "chunks_driver"
    r = subprocess.run([cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-w", "-pthread",
                        f"-I{HERE}", f"-I{cuda_source_dir()}", str(HERE / "chunks_driver.cpp"),
                        "-o", str(exe)], capture_output=True, text=True, timeout=600)
    if r.returncode and "barrier" in r.stderr:
        pytest.skip("the C++ library lacks std::barrier (C++20)")
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def _run(exe: Path, *args: str) -> tuple[int, int, int, str]:
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    m = re.search(r"(\d+) runs, (\d+) failed", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    return r.returncode, int(m.group(1)), int(m.group(2)), r.stdout


def test_kernel_source_on_host_matches_canonical_order(driver: Path) -> None:
    rc, runs, failed, out = _run(driver)
    assert rc == 0 and runs == 540 and failed == 0, out[-3000:]


def test_negative_control_descending_chunk_order_differs(driver: Path) -> None:
    rc, runs, failed, out = _run(driver, "descending")
    # One or two chunks add the same either way (a + b == b + a); the 108 runs of the
    # three-chunk shape (K = 192) must all fail.
    assert rc == 1 and runs == 540 and failed == 108, out[-3000:]
