"""Bitwise batch invariance of the numpy backend (DESIGN section 5, on the CPU oracle).

A request's logits must not change, bit for bit, with its neighbours in the step, where it
sits in the packed rows, how its prompt was chunked, or which physical pages hold it. Both
CPU paths are checked: the compiled kernels and the BLAS tile fallback.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.backend import cpu_ext, numpy_backend
from crucible.backend.numpy_gemm import gemm_rows
from crucible.engine.batch import SegmentSpec, build_packed_batch
from crucible.model.runner import ModelRunner
from crucible.model.tiny import tiny_random_model


@pytest.fixture(scope="module", params=["f32", "int8"])
def model(request):
    return tiny_random_model(seed=11, weights=request.param, n_heads=6, n_kv_heads=2,
                             hidden_size=96)


@pytest.fixture(params=["compiled", "blas-tiles"])
def cpu_path(request, monkeypatch) -> str:
    """Run a test on both CPU paths (the compiled one only where it is built)."""
    if request.param == "compiled" and cpu_ext.extension() is None:
        pytest.skip("compiled CPU kernels not built")
    if request.param == "blas-tiles":
        monkeypatch.setattr(cpu_ext, "_ext", None)
        monkeypatch.setattr(cpu_ext, "_warned", True)  # the fallback notice is tested elsewhere
    return request.param


def _run_alone(model, tokens: list[int], pages: list[int]) -> np.ndarray:
    runner = ModelRunner(model, num_pages=64)
    return runner.forward(build_packed_batch(
        [SegmentSpec("needle", tokens, 0, pages, list(range(len(tokens))))]))


@pytest.mark.usefixtures("cpu_path")
def test_needle_inside_random_batches(model) -> None:
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    needle = rng.integers(0, vocab, 45).tolist()
    alone = _run_alone(model, needle, [60, 61, 62])
    for trial in range(6):
        runner = ModelRunner(model, num_pages=64)
        free = rng.permutation(64).tolist()
        specs, where = [], None
        n_neighbours = int(rng.integers(1, 6))
        slot = int(rng.integers(0, n_neighbours + 1))
        for i in range(n_neighbours + 1):
            if i == slot:
                pages = [free.pop() for _ in range(3)]
                specs.append(SegmentSpec("needle", needle, 0, pages, list(range(45))))
                where = i
                continue
            n = int(rng.integers(1, 40))
            pages = [free.pop() for _ in range(-(-n // 16))]
            specs.append(SegmentSpec(f"n{i}", rng.integers(0, vocab, n).tolist(), 0, pages,
                                     [n - 1]))
        logits = runner.forward(build_packed_batch(specs))
        start = sum(len(s.logits_rows) for s in specs[:where])
        assert np.array_equal(logits[start : start + 45], alone), f"trial {trial}"


@pytest.mark.usefixtures("cpu_path")
@pytest.mark.parametrize("chunks", [[1] * 45, [16, 16, 13], [37, 8], [7, 3, 31, 4]])
def test_chunked_prefill_and_decode_equal_one_shot(model, chunks: list[int]) -> None:
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, model.config.vocab_size, 45).tolist()
    alone = _run_alone(model, tokens, [5, 9, 2])
    runner = ModelRunner(model, num_pages=64)
    pages = [40, 3, 17]  # different physical pages from the one-shot run
    got, start = [], 0
    for n in chunks:
        spec = SegmentSpec("r", tokens[start : start + n], start, pages, list(range(n)))
        got.append(runner.forward(build_packed_batch([spec])))
        start += n
    assert np.array_equal(np.concatenate(got), alone)


@pytest.mark.parametrize("n", [300, 1000])  # one weight slab, and two (768 + 232)
def test_gemm_tiles_are_row_independent(n: int) -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((n, 96)).astype(np.float32)
    x = rng.standard_normal((53, 96)).astype(np.float32)
    full = gemm_rows(w, x)
    for m in (1, 2, 15, 16, 17, 40):
        assert np.array_equal(gemm_rows(w, x[:m]), full[:m])
    assert np.array_equal(gemm_rows(w, x[::-1])[::-1], full)
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4,
                               atol=1e-4)


def test_exp_is_position_independent() -> None:
    """The softmax relies on numpy's f32 exp giving the same bits wherever a value sits."""
    rng = np.random.default_rng(3)
    v = (rng.standard_normal(37) * 10).astype(np.float32)
    want = np.exp(v)
    for offset in range(1, 19):
        buf = np.zeros(offset + 37 + 5, dtype=np.float32)
        buf[offset : offset + 37] = v
        assert np.array_equal(np.exp(buf)[offset : offset + 37], want)


@pytest.mark.usefixtures("cpu_path")
def test_plain_blas_would_not_be_invariant(model, monkeypatch) -> None:
    """Negative control: with a plain ``x @ W.T`` in every GEMM, the needle comparison
    detects a change (on both paths: only the GEMMs are swapped).

    Skipped when this machine's BLAS happens to compute a lone row like a batched one for
    these shapes (then the control cannot show anything).
    """
    def plain(self, x, weight):
        if self.compiled:
            packed = self._packed[weight]
            w, scale = packed.dense(), packed.scale
        else:
            w, scale = self._linear[weight]
        y = x @ w.T
        return y if scale is None else y * scale

    rng = np.random.default_rng(4)
    w = rng.standard_normal((288, 96)).astype(np.float32)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    if np.array_equal((x[:1] @ w.T)[0], (x @ w.T)[0]):
        pytest.skip("this BLAS computes a lone row like a batched one; control not informative")
    monkeypatch.setattr(numpy_backend.NumpyBackend, "linear", plain)
    monkeypatch.setattr(numpy_backend.NumpyBackend, "linear_add",
                        lambda self, x, weight, residual: residual + plain(self, x, weight))
    vocab = model.config.vocab_size
    needle = rng.integers(0, vocab, 20).tolist()
    alone = _run_alone(model, needle, [0, 1])
    runner = ModelRunner(model, num_pages=64)
    packed = runner.forward(build_packed_batch([
        SegmentSpec("x", rng.integers(0, vocab, 9).tolist(), 0, [5], [8]),
        SegmentSpec("needle", needle, 0, [2, 3], list(range(20)))]))
    assert not np.array_equal(packed[1:], alone)
