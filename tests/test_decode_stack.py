"""The batch-1 decode stack's routing on the CPU (its kernels' bits are checked on the GPU:
tests/test_gpu_engine.py, gpu-engine-check): which steps take it, that the forward hands a
backend's ``decode_stack`` the step and falls back to the layers when it declines, and that
profiling (whose stages the stack's kernels span) never takes it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from crucible.kernels import decode_stack as ds
from crucible.kernels.device_weight import DeviceWeight
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


def test_the_mma_forms_refuse_what_they_are_not_built_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_mlp's and the QKV row kernel's MMA forms: int8 only, the stack's shapes; a
    refusal launches nothing. The loader refuses an mma attention form with f32 W_o."""
    import sys
    import types

    from crucible.kernels import linear_rows as cf
    from crucible.kernels import loader
    from test_linear_chunks import dev, weight

    fake = types.ModuleType("cupy")
    fake.float32, fake.int32, fake.uint32, fake.int8 = np.float32, np.int32, np.uint32, np.int8
    monkeypatch.setitem(sys.modules, "cupy", fake)
    launches: list = []
    got: list = []

    def record(fn: Any, grid: Any, block: Any, args: Any, shared_mem: int = 0,
               pdl: bool = False) -> None:
        launches.append(fn)
        got.append((grid, block, args))

    for mod in (cf, ds):
        monkeypatch.setattr(mod, "launch", record)
        monkeypatch.setattr(mod, "ensure_dynamic_smem", lambda fn, n: None)
    monkeypatch.setattr(cf, "fused_kernel", lambda name: name)
    monkeypatch.setattr(cf, "sm_count", lambda: 132)
    monkeypatch.setattr(ds, "_kernel", lambda name: name)
    r, h, norm = dev((1, 576)), dev((1, 576)), dev((576,))
    o_parts, d_parts = dev((9, 1, 576)), dev((24, 1, 576))
    ds.decode_mlp(r, o_parts, dev((576,)), h, norm, 1e-5, weight(3072, 576),
                  weight(576, 1536), d_parts, mma=True, pair=False)
    assert launches == ["decode_mlp<signed char, true>"] and got[-1][:2] == ((24, 1), (32, 18))
    # The pair form: clusters of two CTAs a chunk, half the warps each.
    ds.decode_mlp(r, o_parts, dev((576,)), h, norm, 1e-5, weight(3072, 576),
                  weight(576, 1536), d_parts, mma=True, pair=True)
    assert launches[-1] == "decode_mlp_pair<signed char, true>"
    assert got[-1][:2] == ((48, 1), (32, 9))
    del launches[1:]
    with pytest.raises(ValueError, match="mma order takes int8 gate/up and down"):
        ds.decode_mlp(r, o_parts, None, h, norm, 1e-5, weight(3072, 576, int8=False),
                      weight(576, 1536, int8=False), d_parts, mma=True)
    rope = cf.RopeStore(*(dev((1,), np.int32),) * 3, dev((8, 32)), dev((8, 32)),
                        dev((4, 2, 16, 192)), dev((4, 2, 16, 192)), 0, 9, 3)
    q = dev((1, 576))
    kw = dict(norm=norm, eps=1e-5, epi=cf.EPI_ROPE, rope=rope, parts=d_parts,
              pscale=dev((576,)), x_out=r)
    qkv = replace(weight(960, 576), wb=dev((960, 576), np.uint16))  # the codes as bf16 too
    cf.linear_rows(h, qkv, q, mma=True, **kw)
    assert launches[-1] == "linear_rows<signed char, 1, 1, 2, true>"
    assert got[-1][2][1] is qkv.wb  # the MMA form reads the bf16 codes
    assert got[-1][0] == (30, 1)  # its column blocks are half heads: 2 x 15 CTAs
    with pytest.raises(ValueError, match="one-row int8 norm \\+ RoPE form"):
        cf.linear_rows(h, weight(960, 576, int8=False), q, mma=True, **kw)
    with pytest.raises(ValueError, match="one-row int8 norm \\+ RoPE form"):
        cf.linear_rows(h, qkv, q, mma=True, **{**kw, "norm": None})
    with pytest.raises(ValueError, match="codes as bf16"):
        cf.linear_rows(h, weight(960, 576), q, mma=True, **kw)
    assert len(launches) == 2
    with pytest.raises(ValueError, match="take int8 W_o"):
        loader.decode_kernel(1, 4, mma=True)


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


def test_attention_o_launches_what_paged_attention_launches_plus_o(
        monkeypatch: pytest.MonkeyPatch, smem: None) -> None:
    """attn_decode<1, OW> gets paged_attention's decode arguments, then W_o and the partials
    (kernels/attention.decode_args is the one spelling), and the same checks first."""
    from types import SimpleNamespace

    from crucible.kernels import attention
    from crucible.kernels.device_weight import DeviceWeight

    launches: list[tuple] = []

    def record(fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0,
               pdl: bool = False) -> None:
        launches.append((fn, tuple(grid)[:2], args))

    for mod in (attention, ds):
        monkeypatch.setattr(mod, "decode_kernel", lambda heads, ow=0, mma=False:
                            f"attn_decode<{heads}, {ow}{', true' if mma else ''}>")
        monkeypatch.setattr(mod, "ensure_dynamic_smem", lambda fn, n: None)
    monkeypatch.setattr(attention, "smem_optin_limit", lambda: 227 * 1024)
    monkeypatch.setattr(attention, "sm_count", lambda: 132)
    monkeypatch.setattr(attention, "l2_bytes", lambda: 50 * 2**20)
    monkeypatch.setattr(attention, "launch", record)
    monkeypatch.setattr(ds, "launch", record)
    f32 = np.float32
    q, out = np.zeros((1, 576), f32), np.zeros((1, 576), f32)
    pool = np.zeros((5, 2, 16, 192), f32)
    segs, tables = np.array([[0, 1, 37, 0]], np.int32), np.array([[3, 1, 4]], np.int32)
    wo = DeviceWeight(None, np.zeros((576, 576), np.int8), np.ones(576, f32))
    parts = np.zeros((9, 1, 576), f32)
    attention.paged_attention(q, pool, pool, 1, segs, tables, out, n_heads=9, n_kv_heads=3,
                              max_chunk=1, score_capacity=256, variant="exact-q4-k64")
    meta = SimpleNamespace(segments=segs, page_tables=tables, score_capacity=256)
    ds.attention_o(q, pool, pool, 1, meta, wo, out, parts, 9, 3, split=1)
    (fn0, grid0, plain), (fn1, grid1, stack) = launches
    assert (fn0, fn1) == ("attn_decode<1, 0>", "attn_decode<1, 1>") and grid0 == grid1 == (9, 1)
    assert all(a is b or a == b for a, b in zip(plain[:14], stack[:14]))
    # 9 CTAs, 3 per KV head, share half the L2: 25 MiB / 3 / 512 B positions each.
    assert int(plain[13]) == 25 * 2**20 // (3 * 512)
    assert [int(a) for a in plain[14:]] == [0, 0, 0, 1]
    assert stack[14] is wo.w and stack[15] is parts and [int(a) for a in stack[16:]] == [576, 1]
    # The O split: two CTAs a head (18), each told so; the prefetch budget is the head's.
    ds.attention_o(q, pool, pool, 1, meta, wo, out, parts, 9, 3, split=2)
    fn2, grid2, split = launches[2]
    assert fn2 == "attn_decode<1, 1>" and grid2 == (18, 1) and int(split[17]) == 2
    assert all(a is b or a == b for a, b in zip(split[:17], stack[:17]))
    # An odd column count cannot be halved: one CTA a head.
    wo_odd = DeviceWeight(None, np.zeros((201, 576), np.int8), np.ones(201, f32))
    ds.attention_o(q, pool, pool, 1, meta, wo_odd, out, np.zeros((9, 1, 201), f32), 9, 3,
                   split=2)
    assert launches[-1][1] == (9, 1) and int(launches[-1][2][17]) == 1
    del launches[-1]
    ds.attention_o(q, pool, pool, 1, meta, wo, out, parts, 9, 3, mma=True)
    fn3, grid3, mma = launches[3]
    assert fn3 == "attn_decode<1, 1, true>" and grid3 == (9 * ds.O_SPLIT["mma"], 1)
    assert all(a is b or a == b for a, b in zip(mma[:17], stack[:17]))  # the same arguments
    with pytest.raises(ValueError, match="O split 3 is not built"):
        ds.attention_o(q, pool, pool, 1, meta, wo, out, parts, 9, 3, split=3)
    with pytest.raises(ValueError, match="O partials"):
        ds.attention_o(q, pool, pool, 1, meta, wo, out, parts[:8], 9, 3)
    with pytest.raises(ValueError, match="q must be float32"):
        ds.attention_o(q.astype(np.float64), pool, pool, 1, meta, wo, out, parts, 9, 3)
    wo32 = DeviceWeight(None, np.zeros((576, 576), f32), None)
    with pytest.raises(ValueError, match="mma order takes int8 W_o"):
        ds.attention_o(q, pool, pool, 1, meta, wo32, out, parts, 9, 3, mma=True)
    assert len(launches) == 4  # nothing launched for bad input


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
