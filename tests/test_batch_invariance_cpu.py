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
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.runner import ModelRunner
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


def _row_count_ordered_gemm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` in f32 with a reduction order that depends on the number of rows: a
    deliberately batch-dependent GEMM, for the negative control.

    Every output sums its K products in one explicit running order that starts at
    ``k0 = M % K`` (``M`` = rows in ``x``) and wraps around: a split-K whose split point
    moves with the batch. It is built from elementwise f32 multiplies and adds only (one
    correctly rounded IEEE operation each, no BLAS, no kernel choice, no contraction to
    FMA), so its bits are the same on every machine, and a row's bits change with ``M``.
    """
    m, k = x.shape
    x, w = x.astype(np.float32, copy=False), w.astype(np.float32, copy=False)
    acc = np.zeros((m, w.shape[0]), dtype=np.float32)
    for j in np.roll(np.arange(k), -(m % k)):
        acc += x[:, j : j + 1] * w[None, :, j]
    return acc


def test_row_count_ordered_gemm_is_batch_dependent() -> None:
    """The control's GEMM itself: right to f32 rounding, and a lone row's bits differ from
    the same row in a batch (so the control below has a batch dependence to detect)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((288, 96)).astype(np.float32)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    full = _row_count_ordered_gemm(x, w)
    np.testing.assert_allclose(full, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4,
                               atol=1e-4)
    assert not np.array_equal(_row_count_ordered_gemm(x[:1], w)[0], full[0])


@pytest.mark.usefixtures("cpu_path")
def test_batch_dependent_gemm_is_not_invariant(model, monkeypatch) -> None:
    """Negative control: with every GEMM swapped for one whose reduction order depends on
    the row count (``_row_count_ordered_gemm``), the needle comparison the real backend
    passes detects a change (on both paths: only the GEMMs are swapped).

    The control no longer uses a plain ``x @ W.T``: whether BLAS computes a lone row like a
    batched one depends on which kernel it picks on this CPU (on AVX-512 OpenBLAS it does,
    for these shapes), so such a control showed nothing there. This one is batch-dependent
    by construction, with the same bits on every machine.
    """
    def ordered(self, x, weight):
        if self.compiled:
            packed = self._packed[weight]
            w, scale = packed.dense(), packed.scale
        else:
            w, scale = self._linear[weight]
        y = _row_count_ordered_gemm(x, w)
        return y if scale is None else y * scale

    rng = np.random.default_rng(4)
    monkeypatch.setattr(numpy_backend.NumpyBackend, "linear", ordered)
    monkeypatch.setattr(numpy_backend.NumpyBackend, "linear_add",
                        lambda self, x, weight, residual: residual + ordered(self, x, weight))
    vocab = model.config.vocab_size
    needle = rng.integers(0, vocab, 20).tolist()
    alone = _run_alone(model, needle, [0, 1])
    runner = ModelRunner(model, num_pages=64)
    packed = runner.forward(build_packed_batch([
        SegmentSpec("x", rng.integers(0, vocab, 9).tolist(), 0, [5], [8]),
        SegmentSpec("needle", needle, 0, [2, 3], list(range(20)))]))
    assert not np.array_equal(packed[1:], alone)
