"""cuda/linear_chunks.cu's own source run on the CPU (tests/cuda_host/prelude.h maps the CUDA
it uses onto std::thread and std::barrier) against a plain spelling of the canonical order,
bitwise, for every instantiation over shapes with N and K tails and M = 1..64; and the
negative control: a reference that adds the chunk partials in descending order must not
match. Checks the kernel's index arithmetic without a GPU; the GPU's memory system (fences,
L2 reads, PDL) is gpu-engine-check's job."""

from __future__ import annotations

from pathlib import Path

from host_driver import driver_fixture, run

driver = driver_fixture("chunks_driver.cpp")


def test_kernel_source_on_host_matches_canonical_order(driver: Path) -> None:
    rc, runs, failed, out = run(driver)
    assert rc == 0 and runs == 540 and failed == 0, out[-3000:]


def test_negative_control_descending_chunk_order_differs(driver: Path) -> None:
    rc, runs, failed, out = run(driver, "descending")
    # One or two chunks add the same either way (a + b == b + a); the 108 runs of the
    # three-chunk shape (K = 192) must all fail.
    assert rc == 1 and runs == 540 and failed == 108, out[-3000:]
