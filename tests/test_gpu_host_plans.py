"""Host-side decisions of the GPU backend, checked without a GPU: which steps replay which
CUDA graph, which attention launch a call gets, and the graph switches' parsing."""

from __future__ import annotations

import pytest

from fake_streams import stream_class
from crucible.backend.cupy_graphs import is_decode_step
from crucible.backend.cupy_prefill_graphs import MAX_LENGTH, is_singleton_prefill
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.kernels.variants import (decode_smem_bytes, decode_static_bytes, parse_variant,
                                       plan_launch)


def _batch(*specs: tuple[int, int, list[int]]):
    """specs: (chunk length, absolute start, final rows within the chunk)."""
    return build_packed_batch([
        SegmentSpec(f"r{i}", [1] * n, start, list(range(i * 200, i * 200 + 200)), finals)
        for i, (n, start, finals) in enumerate(specs)])


def test_decode_and_singleton_prefill_classification() -> None:
    assert is_decode_step(_batch((1, 5, [0]), (1, 9, [0])))
    assert not is_singleton_prefill(_batch((1, 5, [0])))  # one row: a decode step
    assert is_singleton_prefill(_batch((40, 0, [39])))  # a whole prompt, last row sampled
    assert is_singleton_prefill(_batch((40, 16, [])))  # a middle chunk: no logits
    assert not is_singleton_prefill(_batch((40, 0, [0, 39])))  # prompt logprobs: eager
    assert not is_singleton_prefill(_batch((40, 0, [20])))  # a final row that is not last
    assert not is_singleton_prefill(_batch((40, 0, [39]), (1, 3, [0])))  # packed: eager
    assert not is_decode_step(_batch((40, 0, [39]), (1, 3, [0])))
    long = build_packed_batch([SegmentSpec("r", [1] * (MAX_LENGTH + 1), 0,
                                           list(range(-(-(MAX_LENGTH + 1) // 16))),
                                           [MAX_LENGTH])])
    assert not is_singleton_prefill(long)


def test_decode_launch_only_for_the_exact_family() -> None:
    kw = dict(n_heads=9, n_kv_heads=3, head_dim=64, capacity=512, smem_limit=227 * 1024)
    exact = plan_launch(parse_variant("exact-q4-k64"), decode=True, **kw)
    assert exact.decode and exact.threads == 256
    assert exact.smem_bytes == decode_smem_bytes(512)
    assert not plan_launch(parse_variant("exact-q4-k64"), decode=False, **kw).decode
    # Diagnostics keep their own kernels, so the online negative control still differs.
    assert not plan_launch(parse_variant("online-q2-k32"), decode=True, **kw).decode
    assert not plan_launch(parse_variant("reference"), decode=True, **kw).decode
    # A history too long for the decode kernel's shared memory takes the tiled path.
    big = dict(kw, capacity=50_000 // 256 * 256, smem_limit=200 * 1024)
    assert decode_smem_bytes(big["capacity"]) > big["smem_limit"]
    assert not plan_launch(parse_variant("exact-q4-k64"), decode=True, **big).decode


def test_decode_heads_per_cta() -> None:
    """A CTA per query head for small decode steps; per KV head (its whole group) once the
    step has enough rows to fill the GPU that way; never more than the kernel is built for."""
    from crucible.kernels.variants import decode_heads_per_cta

    kw = dict(n_heads=9, n_kv_heads=3, head_dim=64, capacity=512, smem_limit=227 * 1024,
              sm_count=132)
    exact = parse_variant("exact-q4-k64")
    assert plan_launch(exact, decode=True, rows=1, **kw).decode_heads == 1
    assert plan_launch(exact, decode=True, rows=43, **kw).decode_heads == 1  # 129 CTAs
    wide = plan_launch(exact, decode=True, rows=44, **kw)  # 132 CTAs of 3 heads
    assert wide.decode and wide.decode_heads == 3
    assert wide.smem_bytes == decode_smem_bytes(512, 3) > decode_smem_bytes(512)
    assert decode_heads_per_cta(32, 4, 64, 132) == 1  # group 8: 8 x 64 > 256 threads
    assert decode_heads_per_cta(8, 8, 64, 132) == 1  # no sharing (MHA)
    assert decode_heads_per_cta(8, 4, 64, 132) == 2
    # When G score vectors do not fit, one head per CTA still does.
    tight = dict(kw, capacity=32768, smem_limit=decode_smem_bytes(32768) + decode_static_bytes())
    one = plan_launch(exact, decode=True, rows=64, **tight)
    assert one.decode and one.decode_heads == 1
    # Static shared memory counts against the same limit: dynamic bytes exactly at the limit
    # (G = 4, capacity 12288 on a 227 KiB device) must not launch G heads per CTA.
    edge = dict(kw, n_heads=12, capacity=12288, smem_limit=decode_smem_bytes(12288, 4))
    assert plan_launch(exact, decode=True, rows=64, **edge).decode_heads == 1


def test_graph_replay_orders_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay waits for the default stream's queued work, refills the metadata, launches,
    and makes the default stream wait for the graph, in that order, all on its stream."""
    import sys
    import types

    import numpy as np

    from crucible.backend.cupy_capture import Captured

    log: list[tuple] = []
    Stream = stream_class(log)

    class Ring:  # page-locked staging (cupy_pinned.PinnedRing): queued on the stream
        def upload(self, host: np.ndarray, dev: str, stream: Stream) -> None:
            log.append((stream.name, "meta", dev, host.tolist()))

    class Graph:
        def launch(self, stream: Stream) -> None:
            log.append((stream.name, "launch"))

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Stream=types.SimpleNamespace(null=Stream("default")))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    cap = Captured(Graph(), "meta_dev", logits="logits", pool=None)
    assert cap.replay(Stream("graphs"), np.array([1, 2]), Ring()) == "logits"
    assert log == [("graphs", "waits", "event(default)"), ("graphs", "meta", "meta_dev", [1, 2]),
                   ("graphs", "launch"), ("default", "waits", "event(graphs)")]


def test_capture_waits_for_the_default_stream_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture's warm-up forward runs only after the default stream's queued work (the
    metadata upload, a pipelined step still in flight): the wait is the first thing queued."""
    import sys
    import types
    from contextlib import nullcontext

    from crucible.backend import cupy_graphs

    log: list[tuple] = []
    Stream = stream_class(log)

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Stream=types.SimpleNamespace(null=Stream("default")),
                                      MemoryPool=lambda: types.SimpleNamespace(
                                          malloc=None, total_bytes=lambda: 4096),
                                      using_allocator=lambda _: nullcontext())
    monkeypatch.setitem(sys.modules, "cupy", fake)
    from crucible.backend import cupy_graph_memory as gm

    memory = gm.GraphMemory()

    def forward(meta: str) -> str:
        # Both forwards run with the LM head pointed at the cache's shared logits buffer.
        log.append(("forward", gm._CAPTURING.get() is memory))
        return "logits"

    cap = cupy_graphs.capture_forward(forward, Stream("graphs"), "meta_dev", "meta", memory)
    assert cap.graph == "graph" and cap.logits == "logits" and cap.pool is memory.pool
    assert gm._CAPTURING.get() is None  # and only while capturing
    assert memory.nbytes == 4096  # measured once the capture is made (graph_stats reads it)
    assert log == [("graphs", "waits", "event(default)"), ("forward", True), ("graphs", "sync"),
                   ("graphs", "begin"), ("forward", True), ("graphs", "end")]
    # wait=False (prefill and mixed graphs, which replay on this stream): the capture
    # follows the warm-up on the stream without the host waiting for it.
    log.clear()
    cupy_graphs.capture_forward(forward, Stream("graphs"), "meta_dev", "meta", memory,
                                wait=False)
    assert log == [("graphs", "waits", "event(default)"), ("forward", True), ("graphs", "begin"),
                   ("forward", True), ("graphs", "end")]


def test_dynamic_smem_opt_in_counts_static_memory() -> None:
    """48 KiB bounds static + dynamic shared memory: 48,448 dynamic bytes next to 992 static
    ones (attn_decode<3>) need the opt-in although the dynamic part alone is under 48 KiB."""
    from types import SimpleNamespace

    from crucible.kernels.loader import ensure_dynamic_smem

    k = SimpleNamespace(shared_size_bytes=992, max_dynamic_shared_size_bytes=0)
    ensure_dynamic_smem(k, 48_448)
    assert k.max_dynamic_shared_size_bytes == 48_448
    small = SimpleNamespace(shared_size_bytes=992, max_dynamic_shared_size_bytes=0)
    ensure_dynamic_smem(small, 40_000)
    assert small.max_dynamic_shared_size_bytes == 0  # no opt-in needed, none made
    big = SimpleNamespace(shared_size_bytes=0, max_dynamic_shared_size_bytes=100_000)
    ensure_dynamic_smem(big, 60_000)
    assert big.max_dynamic_shared_size_bytes == 100_000  # never lowered


def test_decode_graph_metadata_matches_the_batch() -> None:
    """host_meta fills a bucket's buffer from a decode batch: real rows first (tokens,
    positions, each row's page and slot from the general slot mapping, its segment's
    absolute start, its page table zero-padded), then untouched padding rows."""
    import numpy as np

    from crucible.backend.cupy_graphs import BUCKETS, DecodeGraphs
    from crucible.step.batch import SegmentSpec, build_packed_batch

    g = DecodeGraphs.__new__(DecodeGraphs)  # host side only: no device, no stream
    g.width, g.scratch, g._templates = 12, 500, {}
    rng = np.random.default_rng(3)
    for trial in range(50):  # every fifth a step past 64 rows (the large buckets)
        b = int(rng.integers(1, 65)) if trial % 5 else int(rng.integers(65, BUCKETS[-1] + 1))
        bucket = next(x for x in BUCKETS if x >= b)
        pos = rng.integers(0, 190, b)
        specs = [SegmentSpec(f"r{i}", [int(rng.integers(0, 999))], int(p),
                             rng.permutation(400)[: int(p) // 16 + 1].tolist(), [0])
                 for i, p in enumerate(pos)]
        batch = build_packed_batch(specs)
        feed = rng.integers(-1, 64, b).astype(np.int32)
        out = g.host_meta(batch, bucket, 12, feed if b % 2 else None)
        pad = g.host_meta(None, bucket, 12)
        fed = out[9 * bucket + 12 * bucket : 10 * bucket + 12 * bucket]
        assert (fed[:b] == (feed if b % 2 else -1)).all() and (fed[b:] == -1).all()
        slots = batch.slot_mapping()
        assert (out[:b] == batch.token_ids).all()
        assert (out[bucket : bucket + b] == batch.positions).all()
        assert (out[2 * bucket : 2 * bucket + b] == slots >> 4).all()
        assert (out[3 * bucket : 3 * bucket + b] == slots & 15).all()
        seg = out[4 * bucket : 8 * bucket].reshape(bucket, 4)
        assert (seg[:b, 2] == batch.segments[:, 2]).all()
        tables = out[8 * bucket : 8 * bucket + bucket * 12].reshape(bucket, 12)
        for i, s in enumerate(specs):
            assert tables[i, : len(s.pages)].tolist() == list(s.pages)
            assert not tables[i, len(s.pages):].any()
        # Everything else is the all-padding template.
        mask = np.ones(out.size, bool)
        for k in range(4):
            mask[k * bucket : k * bucket + b] = False
        mask[4 * bucket : 4 * bucket + 4 * b] = False
        mask[8 * bucket : 8 * bucket + 12 * b] = False
        mask[9 * bucket + 12 * bucket : 9 * bucket + 12 * bucket + b] = False
        assert (out[mask] == pad[mask]).all()
        assert out.size == 10 * bucket + 12 * bucket  # 4 columns, segments, tables, finals, feed
    # A narrower width (a graph of smaller score capacity) keeps the pages it can read only.
    g.width = 512
    assert g.table_width(256) == 16 and g.table_width(8192) == 512 and g.table_width(10**6) == 512
    batch = build_packed_batch([SegmentSpec("a", [5], 40, list(range(100, 120)), [0])])
    out = g.host_meta(batch, 1, 16)
    assert out[2] == 102 and out[3] == 40 & 15  # page and slot of position 40
    assert out[8 : 8 + 16].tolist() == list(range(100, 116))  # 20 pages grown, 16 kept


def test_decode_prefetch_only_for_small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """attn_decode's L2 prefetch budget: a batch-1 step's CTAs prefetch a whole long history
    into half the L2 (CTAs of one KV head share it); a step with more CTAs than SMs runs in
    waves and prefetches nothing (bench/decode-attention-h200.json)."""
    from crucible.kernels import attention

    monkeypatch.setattr(attention, "sm_count", lambda: 132)
    monkeypatch.setattr(attention, "l2_bytes", lambda: 50 * 2**20)
    half = 25 * 2**20
    # Batch 1, one head per CTA: 9 CTAs, 3 to each KV head's rows.
    assert attention.decode_prefetch_len(9, 3) == half // (3 * 512) >= 8192
    assert attention.decode_prefetch_len(132) == half // (132 * 512) > 0
    assert attention.decode_prefetch_len(133) == attention.decode_prefetch_len(3 * 496) == 0
    assert attention.decode_prefetch_len(0) == half // 512  # never a division by zero
