"""Programmatic dependent launch through the mma order's chain of kernels on a real GPU
(skipped without CuPy or a device): RMSNorm -> gate/up (linear_mma) -> SwiGLU -> down with
the residual (linear_mma) -> RMSNorm, every launch PDL on a stream of its own and in a
captured graph, gives the bits of the same chain launched plainly, at decode and prefill
sizes. Each kernel's input is the previous kernel's output, so a kernel that read it before
``cru_pdl_wait`` would read a half-written buffer (the buffers start as NaN)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.kernels import launch as kl  # noqa: E402
from crucible.kernels import linear_mma as lm  # noqa: E402
from crucible.kernels.device_weight import upload_weight  # noqa: E402
from crucible.kernels.model_ops import flat_launch, rows_launch  # noqa: E402

D, F = 576, 1536


def weights(seed: int) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    gu = upload_weight(rng.integers(-127, 128, (2 * F, D)).astype(np.int8),
                       (0.001 + 0.01 * rng.random(2 * F)).astype(np.float32))
    down = upload_weight(rng.integers(-127, 128, (D, F)).astype(np.int8),
                         (0.001 + 0.01 * rng.random(D)).astype(np.float32))
    norm = cp.asarray((0.5 + rng.random(D)).astype(np.float32))
    return gu, down, norm


def buffers(m: int) -> tuple[Any, ...]:
    """xn, gate/up, SwiGLU, down, out; allocated before any capture (none inside one)."""
    return tuple(cp.empty(s, cp.float32) for s in ((m, D), (m, 2 * F), (m, F), (m, D), (m, D)))


def chain(x: Any, gu: Any, down: Any, norm: Any, bufs: tuple[Any, ...], pdl: bool) -> Any:
    m = x.shape[0]
    xn, g, h, y, out = bufs
    for b in bufs:
        b.fill(cp.nan)
    args = (np.int32(D), np.float32(1e-5))
    rows_launch("rmsnorm_rows", m, (x, norm, xn) + args, pdl=pdl)
    lm.linear_mma(xn, gu, g, pdl=pdl)
    flat_launch("swiglu_rows", h.size, (g, h, np.int32(F), np.int64(h.size)), pdl=pdl)
    lm.linear_mma(h, down, y, x, pdl=pdl)
    rows_launch("rmsnorm_rows", m, (y, norm, out) + args, pdl=pdl)
    return out


def same(a: Any, b: Any) -> bool:
    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


@pytest.mark.parametrize("m", (1, 16, 200))
def test_pdl_chain_gives_the_plain_bits(m: int) -> None:
    if not kl.status()["available"]:
        pytest.skip(kl.status()["reason"])
    gu, down, norm = weights(m)
    x = cp.asarray(np.random.default_rng(m + 1).standard_normal((m, D)).astype(np.float32))
    bufs = buffers(m)
    ref = chain(x, gu, down, norm, bufs, pdl=False).copy()
    assert bool(cp.isfinite(ref).all())
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(3):  # back-to-back chains: each one's first kernel waits on the last
            got = chain(x, gu, down, norm, bufs, pdl=True)
            stream.synchronize()
            assert same(got, ref), f"PDL on a stream, M={m}"
        stream.begin_capture()
        outs = chain(x, gu, down, norm, bufs, pdl=True)
        graph = stream.end_capture()
        for _ in range(3):
            outs.fill(cp.nan)
            graph.launch(stream)
            stream.synchronize()
            assert same(outs, ref), f"PDL in a graph, M={m}"
    # Negative control: another norm weight changes the chain's bits.
    other = chain(x, gu, down, norm * 1.5, buffers(m), pdl=False)
    assert not same(other, ref)
