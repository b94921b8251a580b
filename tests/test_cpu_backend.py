"""The numpy backend's choice of CPU path, its thread setting, and whole forwards.

- CRUCIBLE_CPU_THREADS: validated at start-up; the thread count changes no bit.
- The compiled kernels' AVX2 and scalar versions give the same logits bit for bit.
- Without the extension the backend falls back to the BLAS tile path and says so once.
- The extension builds from this checkout (setup.py), when a compiler is present.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from crucible.backend import cpu_ext
from crucible.backend.numpy_backend import NumpyBackend
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.errors import ConfigError
from crucible.model.loader import LoadedModel
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model
from tests.cpu_reference import build_extension

compiled_only = pytest.mark.skipif(cpu_ext.extension() is None,
                                   reason="compiled CPU kernels not built (pip install -e .)")


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return tiny_random_model(seed=6, weights="int8", n_heads=9, n_kv_heads=3, head_dim=64,
                             hidden_size=96)


def _logits(model: LoadedModel, threads: int | None = None,
            **backend_attrs: object) -> np.ndarray:
    runner = ModelRunner(model, num_pages=16, settings=Settings(cpu_threads=threads))
    for name, value in backend_attrs.items():
        setattr(runner.backend, name, value)
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    specs = [SegmentSpec("a", rng.integers(0, vocab, 37).tolist(), 0, [3, 9, 1], list(range(37))),
             SegmentSpec("b", rng.integers(0, vocab, 5).tolist(), 0, [4], [4])]
    return runner.forward(build_packed_batch(specs))


# The CRUCIBLE_CPU_THREADS setting's parsing and default: test_settings.py.


@compiled_only
def test_thread_count_and_kernel_change_no_logit_bit(model) -> None:
    want = _logits(model, threads=1)
    for threads in (2, 3, 5):
        assert np.array_equal(_logits(model, threads=threads), want), threads
    assert np.array_equal(_logits(model, scalar=True), want)


@compiled_only
def test_compiled_path_keeps_int8_weights_as_int8(model) -> None:
    be = ModelRunner(model, num_pages=4).backend
    assert be.compiled and be.kernel in ("avx2", "scalar")
    assert all(p.panels.dtype == np.int8 for p in be._packed.values())
    assert not be._linear


def test_fallback_without_the_extension_says_so_once(model, monkeypatch, caplog) -> None:
    monkeypatch.setattr(cpu_ext, "_ext", None)
    monkeypatch.setattr(cpu_ext, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="crucible.backend"):
        first = _logits(model)
        second = _logits(model)
    notices = [r for r in caplog.records if "compiled CPU kernels not built" in r.message]
    assert len(notices) == 1 and "BLAS tile path" in notices[0].message
    assert np.array_equal(first, second)
    be = ModelRunner(model, num_pages=4).backend
    assert not be.compiled and be.kernel == "blas-tiles" and not be._packed
    assert be._linear["l0.qkv"][0].dtype == np.float32  # int8 codes held as f32 there
    monkeypatch.undo()
    if cpu_ext.extension() is not None:  # the compiled path: other bits, the same model
        np.testing.assert_allclose(_logits(model), first, atol=5e-4)


@pytest.mark.slow
def test_extension_builds_from_this_checkout(tmp_path) -> None:
    ext = build_extension(tmp_path)
    if ext is None:
        pytest.skip("no C compiler (or Python headers) here: the extension is optional")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    panels = np.zeros((1, 4, 16), dtype=np.float32)
    panels[0, :, 0] = 1.0  # column 0 sums the row
    out = np.empty((3, 1), dtype=np.float32)
    ext.gemm(x, panels, None, None, out, 3, 1, 4, 2, True)
    assert out[:, 0].tolist() == [6.0, 22.0, 38.0]
