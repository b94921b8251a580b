"""The batch-1 decode stack's launches on the CPU (a fake cupy records them): which kernel
each form takes, with which grid and arguments (the MMA forms' bf16 codes, decode_mlp_pair's
clusters, the attention's O split), and that every refusal launches nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from crucible.kernels import decode_stack as ds
from crucible.kernels.device_weight import DeviceWeight


@pytest.fixture
def smem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "smem_optin_limit", lambda: 227 * 1024)  # the H200's opt-in


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


def test_attention_o_launches_what_paged_attention_launches_plus_o(
        monkeypatch: pytest.MonkeyPatch, smem: None) -> None:
    """attn_decode<1, OW> gets paged_attention's decode arguments, then W_o and the partials
    (kernels/attention.decode_args is the one spelling), and the same checks first."""
    from types import SimpleNamespace

    from crucible.kernels import attention

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
    # No O partials, then q's row stride and no RoPE tables (the RoPE-in form's).
    assert [int(a) for a in plain[14:]] == [0, 0, 0, 1, 576, 0, 0]
    assert stack[14] is wo.w and stack[15] is parts
    assert [int(a) for a in stack[16:]] == [576, 1, 576, 0, 0]
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
