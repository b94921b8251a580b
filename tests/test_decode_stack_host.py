"""cuda/decode_stack.cu's own source (decode_mlp, combine_rows) run on the CPU
(tests/cuda_host/prelude.h maps the CUDA it uses onto std::thread and std::barrier, warp
shuffles included) against a plain spelling of the five-kernel layer's order, bitwise: h =
x + O's partials (O's residual epilogue), the canonical RMSNorm tree, gate/up, SwiGLU, the
chunk partials of down, and their ascending combine; f32 and int8, several hidden and FFN
sizes, 1 and 2 rows, 0-9 O partials. The negative control adds O's partials in descending
order and must fail exactly the runs that have 3 or 9 of them. The GPU's side (cp.async,
PDL, the attention's O partials, whole steps) is gpu-engine-check's."""

from __future__ import annotations

from pathlib import Path

from host_driver import driver_fixture, run

driver = driver_fixture("stack_driver.cpp")


def test_kernel_source_on_host_matches_the_layer_order(driver: Path) -> None:
    rc, runs, failed, out = run(driver)
    assert rc == 0 and runs == 96 and failed == 0, out[-3000:]


def test_negative_control_descending_o_partials_differ(driver: Path) -> None:
    rc, runs, failed, out = run(driver, "descending")
    # 0 or 1 partials add the same either way; every run with 3 or 9 must fail.
    assert rc == 1 and runs == 96 and failed == 48, out[-3000:]
