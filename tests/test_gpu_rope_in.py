"""attn_decode's RoPE-in form on a real GPU (skipped without CuPy or a device;
crucible/backend/cupy_rope_in.py): one launch that rotates a decode step's Q and K, stores
K/V and attends gives rope_store's pool bits and paged_attention's output bits, launched
plainly and as the PDL successor of the kernel that writes the QKV rows; a sign flipped in
the sine table must change both (the negative control). Through the engine, a workload of
64 running requests gives the same tokens and logprobs with the form on and off."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu  # tests/conftest.py skips them without a CUDA device

from crucible.backend.rope import rope_table  # noqa: E402
from crucible.kernels import attention as ka  # noqa: E402
from crucible.kernels import linear_mma as lm  # noqa: E402
from crucible.kernels.device_weight import upload_weight  # noqa: E402
from crucible.kernels.model_ops import rows_launch  # noqa: E402
from crucible.kernels.variants import parse_variant, score_capacity  # noqa: E402
from crucible.step.batch import pack_decodes  # noqa: E402

H, KV, HD, LAYERS, LAYER, D = 9, 3, 64, 3, 1, 576
W = (H + 2 * KV) * HD


def step(rows: int, seed: int) -> dict[str, Any]:
    """A decode step of ``rows`` rows: histories across the QK sweep (128 keys) and V tile
    (128) edges, pages shuffled, random pools; x and an int8 QKV weight for the QKV GEMM."""
    rng = np.random.default_rng(seed)
    lens = np.concatenate([[1, 2, 127, 128, 129, 256, 257, 600],
                           rng.integers(1, 400, rows - 8)])[:rows]
    ends = np.cumsum(-(-lens // 16))
    perm = rng.permutation(int(ends[-1]) + 5)
    batch = pack_decodes([str(i) for i in range(rows)], lens - 1, np.split(perm[:ends[-1]],
                                                                          ends[:-1]))
    tables = batch.page_tables
    pool = (perm.size, LAYERS, 16, KV * HD)
    cos, sin = rope_table(1024, HD, 10000.0)
    return dict(segs=cp.asarray(batch.segments), tables=cp.asarray(tables),
                k=cp.asarray(rng.standard_normal(pool, np.float32)),
                v=cp.asarray(rng.standard_normal(pool, np.float32)),
                positions=cp.asarray((lens - 1).astype(np.int32)),
                pages=cp.asarray(tables[np.arange(rows), (lens - 1) // 16]),
                slots=cp.asarray(((lens - 1) % 16).astype(np.int32)),
                cos=cp.asarray(cos), sin=cp.asarray(sin),
                x=cp.asarray(rng.standard_normal((rows, D), np.float32)),
                wq=upload_weight(rng.integers(-127, 128, (W, D)).astype(np.int8),
                                 (0.001 + 0.01 * rng.random(W)).astype(np.float32)),
                capacity=score_capacity(int(lens.max())))


def buffers(d: dict[str, Any]) -> dict[str, Any]:
    """Fresh pools (copies) and NaN-filled QKV, Q and output buffers for one chain."""
    rows = d["x"].shape[0]
    return dict(k=d["k"].copy(), v=d["v"].copy(), qkv=cp.full((rows, W), cp.nan, cp.float32),
                q=cp.full((rows, H * HD), cp.nan, cp.float32),
                out=cp.full((rows, H * HD), cp.nan, cp.float32))


def chain(d: dict[str, Any], b: dict[str, Any], rope_in: bool, pdl: bool,
          sin: Any = None) -> tuple[Any, Any, Any]:
    """The QKV GEMM, then rope_store + paged_attention or the RoPE-in attention, into the
    buffers ``b`` (launches only: a graph may capture it); returns (out, k pool, v pool)."""
    rows, i32 = d["x"].shape[0], np.int32
    lm.linear_mma(d["x"], d["wq"], b["qkv"], pdl=pdl)
    if rope_in:
        plan = ka.rope_in_plan(H, KV, rows, d["capacity"], parse_variant("exact-q4-k64"))
        assert plan is not None and plan.decode_heads == 3
        ka.decode_attention_rope(b["qkv"], d["cos"], d["sin"] if sin is None else sin, b["k"],
                                 b["v"], LAYER, d["segs"], d["tables"], b["out"], n_heads=H,
                                 n_kv_heads=KV, score_capacity=d["capacity"], plan=plan,
                                 pdl=pdl)
    else:
        rows_launch("rope_store", rows, (b["qkv"], b["q"], d["positions"], d["pages"],
                                         d["slots"], d["cos"], d["sin"], b["k"], b["v"],
                                         i32(LAYER), i32(LAYERS), i32(H), i32(KV), i32(HD)),
                    threads=128, pdl=pdl)
        ka.paged_attention(b["q"], b["k"], b["v"], LAYER, d["segs"], d["tables"], b["out"],
                           n_heads=H, n_kv_heads=KV, max_chunk=1,
                           score_capacity=d["capacity"], pdl=pdl)
    return b["out"], b["k"], b["v"]


def separate(d: dict[str, Any], pdl: bool) -> tuple[Any, Any, Any]:
    return chain(d, buffers(d), False, pdl)


def fused(d: dict[str, Any], pdl: bool, sin: Any = None) -> tuple[Any, Any, Any]:
    return chain(d, buffers(d), True, pdl, sin)


def same(a: Any, b: Any) -> bool:
    return bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


@pytest.mark.parametrize("rows", (64, 300))
def test_rope_in_gives_rope_store_and_attention_bits(rows: int) -> None:
    d = step(rows, seed=rows)
    want = separate(d, pdl=False)
    assert not bool(cp.isnan(want[0]).any())
    for pdl in (False, True):
        got = fused(d, pdl)
        cp.cuda.Device().synchronize()
        assert all(same(g, w) for g, w in zip(got, want)), pdl
    # Negative control: the other rotation direction changes the output and the K pool.
    flipped = fused(d, False, sin=-d["sin"])
    assert not same(flipped[0], want[0]) and not same(flipped[1], want[1])
    assert same(flipped[2], want[2])  # V is copied, never rotated


def test_rope_in_inside_a_graph_gives_the_same_bits() -> None:
    d = step(64, seed=3)
    want = separate(d, pdl=True)
    b = buffers(d)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        got = chain(d, b, True, pdl=True)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    assert all(same(g, w) for g, w in zip(got, want))


def test_the_engine_gives_the_same_bits_with_rope_in_on_and_off(monkeypatch) -> None:
    from crucible import LLM, SamplingParams
    from crucible.backend import cupy_rope_in
    from crucible.engine.settings import Settings
    from crucible.model.tiny import tiny_random_model

    # int8 weights in mma order: only there does attn_in leave RoPE to the attention (the
    # fma order's row kernel fuses it into the QKV GEMM at decode sizes).
    model = tiny_random_model(seed=5, weights="int8", max_context=1024, hidden_size=D,
                              n_heads=H, n_kv_heads=KV, head_dim=HD, ffn_size=1536)
    rng = np.random.default_rng(9)
    vocab = model.config.vocab_size
    prompts = [rng.integers(0, vocab, int(n)).tolist() for n in rng.integers(5, 200, 72)]
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True, temperature=t, seed=4,
                             logprobs=2) for m, t in zip(rng.integers(16, 48, 72), [0.0, 0.9] * 36)]
    calls = []
    real = cupy_rope_in.attention

    def counted(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(cupy_rope_in, "attention", counted)

    def run(on: bool) -> list:
        monkeypatch.setattr(ka, "ROPE_IN", on)
        llm = LLM(model, settings=Settings(device="cuda", weights="int8", gemm="mma",
                                           num_pages=4096, max_running=96))
        assert llm.engine.runner.backend.mma
        outs = llm.generate(prompts, params)
        assert llm.engine.allocator.num_free == llm.engine.allocator.num_pages
        return [(o.token_ids, [[(t, struct.pack("<d", p)) for t, p in lp.items()]
                               for lp in o.logprobs]) for o in outs]

    off = run(False)
    assert not calls
    on = run(True)
    assert calls  # the decode steps of 44+ rows took the form
    assert on == off
