"""The start-up prebuild on a real GPU (skipped without CuPy or a device): the attention
module built as parts on threads gives every variant the bits of the one-program build it
replaced, and the prebuild really builds the modules its options name."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.checks.attention_cases import Case
from crucible.checks.attention_suite import HETERO
from crucible.kernels import loader, source
from crucible.kernels.variants import all_variants

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device


def _every_variant(d: dict) -> dict[str, bytes]:
    from crucible.checks.attention_check import run_variant

    loader.attention_kernel.cache_clear()
    return {v.name: cp.asnumpy(run_variant(v, d)[0]).tobytes() for v in all_variants()}


def test_split_attention_module_gives_the_one_program_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from crucible.checks.attention_cases import build
    from crucible.checks.attention_check import to_device

    d = to_device(build(Case("hetero", 9, 3, HETERO, pages="interleaved", seed=2)))
    parts = loader.attention_module()
    assert len(parts.parts) > 1  # the module really is split
    for build_part in parts.builds():  # as the prebuild does, on pool threads or not
        build_part()
    split = _every_variant(d)
    whole = source.KernelModule(parts.name, (tuple(n for p in parts.parts for n in p),))
    monkeypatch.setattr(loader, "attention_module", lambda: whole)
    try:
        one = _every_variant(d)
    finally:
        loader.attention_kernel.cache_clear()
    assert split.keys() == one.keys() and len(split) > 10
    assert split == one  # byte for byte, every variant (the online ones included)
    exact = np.frombuffer(split["exact-q4-k64"], np.float32)
    assert exact.size and np.isfinite(exact).all()  # every row written: a real comparison


def test_prebuild_builds_its_programs_on_threads() -> None:
    from crucible.backend import cupy_prebuild
    from crucible.backend.options import BackendOptions

    pre = cupy_prebuild.Prebuild(cupy_prebuild.jobs(BackendOptions(gemm="mma", wgmma=None)),
                                 int(cp.cuda.runtime.getDevice()))
    pre.wait(lambda msg: None)
    assert pre.errors() == [] and pre.threads >= 1
    assert all(f.result() is not None for f in pre.futures)
