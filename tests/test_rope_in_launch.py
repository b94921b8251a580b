"""attn_decode's RoPE-in form on the CPU (kernels/attention.py, backend/cupy_rope_in.py;
launches recorded, no GPU): which decode steps take it (a KV head's whole group a CTA, the
switch on), what it launches, and the checks that refuse bad arguments before a launch.
Its bits are checked on the host (tests/cuda_host/decode_attn_driver.cpp) and on the GPU
(tests/test_gpu_rope_in.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from crucible.backend import cupy_rope_in
from crucible.kernels import attention as ka
from crucible.kernels.variants import parse_variant

EXACT = parse_variant("exact-q4-k64")


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    launches: list[tuple] = []

    def record(fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0,
               pdl: bool = False) -> None:
        launches.append((fn, tuple(grid), args, shared_mem, pdl))

    monkeypatch.setattr(ka, "decode_kernel", lambda heads, rope=False:
                        f"attn_decode<{heads}, 0{', false, true' if rope else ''}>")
    monkeypatch.setattr(ka, "ensure_dynamic_smem", lambda fn, n: None)
    monkeypatch.setattr(ka, "launch", record)
    monkeypatch.setattr(ka, "smem_optin_limit", lambda: 227 * 1024)
    monkeypatch.setattr(ka, "sm_count", lambda: 132)
    return launches


def test_which_steps_take_the_form(device: list, monkeypatch: pytest.MonkeyPatch) -> None:
    # 9 query heads over 3 KV heads: a group a CTA once 3 x rows CTAs fill the 132 SMs.
    assert ka.rope_in_plan(9, 3, 43, 256, EXACT) is None  # a head a CTA: three share a KV head
    plan = ka.rope_in_plan(9, 3, 44, 256, EXACT)
    assert plan is not None and plan.decode and plan.decode_heads == 3
    assert ka.rope_in_plan(8, 2, 256, 256, EXACT) is None  # group 4: not built
    assert ka.rope_in_plan(9, 3, 64, 256, parse_variant("online-q2-k32")) is None
    # The backend asks only for pure decode steps of head_dim 64, with the switch on.
    be = SimpleNamespace(cfg=SimpleNamespace(n_heads=9, n_kv_heads=3, head_dim=64),
                         variant=EXACT)
    segs = np.zeros((64, 4), np.int32)
    meta = SimpleNamespace(max_chunk=1, mixed=None, segments=segs, score_capacity=256)
    monkeypatch.setattr(ka, "ROPE_IN", False)
    assert cupy_rope_in.plan(be, meta) is None
    monkeypatch.setattr(ka, "ROPE_IN", True)
    assert cupy_rope_in.plan(be, meta) == ka.rope_in_plan(9, 3, 64, 256, EXACT)
    assert cupy_rope_in.plan(be, SimpleNamespace(**{**meta.__dict__, "max_chunk": 2})) is None
    assert cupy_rope_in.plan(be, SimpleNamespace(**{**meta.__dict__, "mixed": object()})) is None


def test_the_launch_and_its_checks(device: list) -> None:
    f32, rows = np.float32, 64
    qkv, out = np.zeros((rows, 960), f32), np.zeros((rows, 576), f32)
    pool = np.zeros((40, 2, 16, 192), f32)
    cos, sin = np.zeros((512, 32), f32), np.zeros((512, 32), f32)
    segs = np.stack([np.arange(rows), np.ones(rows), np.full(rows, 20), np.arange(rows)],
                    1).astype(np.int32)
    tables = np.zeros((rows, 2), np.int32)
    plan = ka.rope_in_plan(9, 3, rows, 256, EXACT)
    kw = dict(n_heads=9, n_kv_heads=3, score_capacity=256, plan=plan, pdl=True)
    ka.decode_attention_rope(qkv, cos, sin, pool, pool, 1, segs, tables, out, **kw)
    (fn, grid, args, smem, pdl), = device
    assert fn == "attn_decode<3, 0, false, true>" and grid == (3, rows, 1) and pdl
    assert args[0] is qkv and args[7] is out and smem == plan.smem_bytes
    assert int(args[18]) == 960 and args[19] is cos and args[20] is sin  # QKV's row stride
    bad = [((np.zeros((rows, 576), f32), cos, sin), "qkv shape"),
           ((qkv, np.zeros((512, 64), f32), sin), "cos must be"),
           ((qkv, cos, np.zeros((512, 32), np.float64)), "sin must be float32"),
           ((np.zeros((rows, 960), np.float64), cos, sin), "qkv must be float32")]
    for (q, c, s), msg in bad:
        with pytest.raises(ValueError, match=msg):
            ka.decode_attention_rope(q, c, s, pool, pool, 1, segs, tables, out, **kw)
    with pytest.raises(ValueError, match="one segment a row"):
        ka.decode_attention_rope(qkv, cos, sin, pool, pool, 1, segs[:10], tables, out, **kw)
    assert len(device) == 1  # a refusal launches nothing
