"""The batch-1 decode stack's routing on the CPU (its kernels' bits are checked on the GPU:
tests/test_gpu_engine.py, gpu-engine-check): which steps take it, that the forward hands a
backend's ``decode_stack`` the step and falls back to the layers when it declines, and that
profiling (whose stages the stack's kernels span) never takes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from crucible.kernels import decode_stack as ds
from crucible.backend.numpy_backend import NumpyBackend
from crucible.backend.profile import ProfiledBackend
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.kernels.variants import parse_variant
from crucible.model import llama
from crucible.model.tiny import tiny_config, tiny_random_model
from crucible.model.weights import backend_weights

SMOLLM2 = dict(vocab_size=4096, hidden_size=576, n_layers=2, n_heads=9, n_kv_heads=3,
               head_dim=64, ffn_size=1536, max_context=8192)
EXACT = parse_variant("exact-q4-k64")


@pytest.fixture
def smem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "smem_optin_limit", lambda: 227 * 1024)  # the H200's opt-in


def test_fits_the_default_model_at_batch_one_only(smem: None) -> None:
    cfg = tiny_config(**SMOLLM2)
    assert ds.fits(cfg, 1, 512, EXACT, 1) and ds.fits(cfg, 1, 512, EXACT, 4)
    assert not ds.fits(cfg, 2, 512, EXACT, 1)  # weights would be re-read per row
    assert not ds.fits(cfg, 0, 512, EXACT, 1)
    for name in ("online-q2-k32", "reference"):  # their attention is not attn_decode
        assert not ds.fits(cfg, 1, 512, parse_variant(name), 1)


def test_fits_under_mma_takes_int8_only(smem: None) -> None:
    cfg = tiny_config(**SMOLLM2)
    assert ds.fits(cfg, 1, 512, EXACT, 1, mma=True)
    assert not ds.fits(cfg, 1, 512, EXACT, 4, mma=True)  # f32 weights keep linear.cu's order
    assert not ds.fits(cfg, 2, 512, EXACT, 1, mma=True)


def test_the_engine_takes_each_orders_stack_forms(
        monkeypatch: pytest.MonkeyPatch, smem: None) -> None:
    """Under gemm "mma" (int8) a batch-1 step runs the stack's MMA forms; f32 weights under
    mma and every fma step run the fma stack; the stack switched off runs neither."""
    from types import SimpleNamespace

    from crucible.backend import cupy_stack

    monkeypatch.setattr(cupy_stack, "_stack_layers", lambda b, meta, mma: ("stack", mma))
    meta = SimpleNamespace(max_chunk=1, segments=np.zeros((1, 4), np.int32), num_rows=1,
                           score_capacity=512)

    def backend(mma: bool, mode: str) -> SimpleNamespace:
        return SimpleNamespace(mma=mma, mode=mode, use_stack=True, variant=EXACT,
                               cfg=tiny_config(**SMOLLM2))

    assert cupy_stack.decode_stack(backend(True, "int8"), meta) == ("stack", True)
    assert cupy_stack.decode_stack(backend(True, "f32"), meta) == ("stack", False)
    assert cupy_stack.decode_stack(backend(False, "int8"), meta) == ("stack", False)
    off = backend(True, "int8")
    off.use_stack = False
    assert cupy_stack.decode_stack(off, meta) is None


def test_fits_refuses_shapes_the_kernels_are_not_built_for(smem: None) -> None:
    for change in (dict(hidden_size=640, n_heads=10, n_kv_heads=2),  # decode_mlp: K <= 576
                   dict(ffn_size=1568),  # F % 64
                   dict(ffn_size=1600 * 2),  # 50 down partials > 24
                   dict(head_dim=32, n_heads=18, n_kv_heads=6)):
        assert not ds.fits(tiny_config(**{**SMOLLM2, **change}), 1, 512, EXACT, 1), change


def test_fits_needs_w_o_beside_the_attention_memory(smem: None) -> None:
    cfg = tiny_config(**SMOLLM2)
    # f32 W_o's chunk is 576 * 64 * 4 = 147 KiB: fits beside a short score vector only.
    assert ds.fits(cfg, 1, 8192, EXACT, 4) and not ds.fits(cfg, 1, 16384, EXACT, 4)
    assert ds.attention_smem(8192, 576, 4) - ds.attention_smem(8192, 576, 1) == 576 * 64 * 3


class _Stacked(NumpyBackend):
    """A backend whose decode_stack runs the layers itself (or declines), recording calls."""

    def __init__(self, take: bool) -> None:
        super().__init__()
        self.take, self.calls = take, 0

    def decode_stack(self, meta: Any) -> Any:
        self.calls += 1
        if not self.take:
            return None
        x = self.embed(meta)  # the stack embeds itself
        return llama.layers(self.cfg, self, x, meta) * 0.0 + 1.0  # marks the stack's output


def _logits(be: Any, model: Any) -> np.ndarray:
    be.load_weights(model.config, backend_weights(model.weights, "f32"))
    be.allocate_pool(4)
    batch = build_packed_batch([SegmentSpec("r", [3, 1, 4], 0, [0], [2])])
    return llama.forward(model.config, be, batch)


def test_forward_uses_the_stack_and_falls_back_when_it_declines() -> None:
    model = tiny_random_model(seed=2)
    plain = _logits(NumpyBackend(), model)
    declined, taken = _Stacked(take=False), _Stacked(take=True)
    assert np.array_equal(_logits(declined, model), plain) and declined.calls == 1
    assert not np.array_equal(_logits(taken, model), plain) and taken.calls == 1


def test_profiling_never_takes_the_stack() -> None:
    be = _Stacked(take=True)
    prof = ProfiledBackend(be)
    meta = prof.prepare(build_packed_batch([SegmentSpec("r", [3], 0, [0], [0])]))
    assert prof.decode_stack(meta) is None  # the forward then runs the layers stage by stage
    model = tiny_random_model(seed=2)
    assert np.array_equal(_logits(prof, model), _logits(NumpyBackend(), model))
    assert be.calls == 0


def test_python_limits_match_the_kernels() -> None:
    """The host's bounds are the CUDA sources' (a drift would launch past a register array
    or a launch bound)."""
    import re

    from crucible.kernels import linear_rows as cf
    from crucible.kernels.source import read_cuda_source

    parts = re.search(r"#define CRU_MAX_PARTS (\d+)", read_cuda_source("rows_chunk.cuh"))
    bound = re.search(r"__launch_bounds__\((\d+), 1\)\s*decode_mlp",
                      read_cuda_source("decode_stack.cu"))
    assert parts and int(parts.group(1)) == cf.COMBINE_MAX_PARTS
    assert bound and int(bound.group(1)) == ds.MLP_MAX_K  # 2 warps x 9 chunks of 64


def test_qkv_gather_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's first QKV reads the embedding itself: x's pointer is the table and the
    last three arguments are ids, feed and fed (nulls without a gather); bad gathers raise
    before anything is launched."""
    import sys
    import types

    from crucible.kernels import linear_rows as cf
    from test_linear_chunks import dev, weight

    fake = types.ModuleType("cupy")
    fake.float32, fake.int32, fake.uint32, fake.int8 = np.float32, np.int32, np.uint32, np.int8
    monkeypatch.setitem(sys.modules, "cupy", fake)
    launches: list[tuple] = []
    monkeypatch.setattr(cf, "fused_kernel", lambda name: name)
    monkeypatch.setattr(cf, "ensure_dynamic_smem", lambda fn, n: None)
    monkeypatch.setattr(cf, "sm_count", lambda: 132)
    monkeypatch.setattr(cf, "launch", lambda fn, grid, block, args, shared_mem=0, pdl=False:
                        launches.append((fn, args)))
    table, wd = dev((100, 576)), weight(960, 576)
    ids, feed, fed = dev((1,), np.int32), dev((1,), np.int32), dev((64,), np.int32)
    rope = cf.RopeStore(*(dev((1,), np.int32),) * 3, dev((8, 32)), dev((8, 32)),
                        dev((4, 2, 16, 192)), dev((4, 2, 16, 192)), 0, 9, 3)
    q, r = dev((1, 576)), dev((1, 576))
    kw = dict(norm=dev((576,)), eps=1e-5, epi=cf.EPI_ROPE, rope=rope)
    cf.linear_rows(cf.Gather(table, ids, feed, fed), wd, q, x_out=r, **kw)
    cf.linear_rows(cf.Gather(table, ids), wd, q, x_out=r, **kw)
    cf.linear_rows(dev((1, 576)), wd, q, **kw)
    (name, a), (_, b), (_, c) = launches
    assert name == "linear_rows<signed char, 1, 1, 2>"
    assert a[0] is table and b[0] is table and a[-4] is r
    assert a[-3:] == (ids, feed, fed) and b[-3] is ids and [int(v) for v in b[-2:]] == [0, 0]
    assert [int(v) for v in c[-4:]] == [0, 0, 0, 0]  # no x_out, no gather
    bad = [(cf.Gather(table, dev((1,), np.float32)), {}, "ids must be int32"),
           (cf.Gather(table, ids, feed), {}, "feed and fed go together"),
           (cf.Gather(table, ids, dev((2,), np.int32), fed), {}, "feed must be int32"),
           (cf.Gather(table, ids), dict(parts=dev((3, 1, 576))), "adds no partials"),
           (dev((1, 576)), dict(x_out=r), "x_out needs parts or a gather")]
    for x, more, msg in bad:
        with pytest.raises(ValueError, match=msg):
            cf.linear_rows(x, wd, q, **{**kw, **more})
    with pytest.raises(ValueError, match="one row per CTA, SwiGLU or RoPE"):
        cf.linear_rows(cf.Gather(table, ids), weight(576, 576), dev((1, 576)))
    assert len(launches) == 3
