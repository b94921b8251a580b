"""The torch SDPA peer column of the attention bench (torch is optional, never required).

Each request's history is gathered out of the page pool into contiguous f32 K/V expanded
to every query head, outside the timed region; requests with the same (start, length) are
batched into one call. Prefixed slices use a bottom-right causal mask. The per-shape step
is captured in a torch CUDA graph of ``iters`` steps when capture works (eager otherwise).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from crucible.checks.attention_cases import LAYER, HostBatch
from crucible.checks.oracle import HEAD_DIM, gather_history


def _calls(b: HostBatch, torch: Any) -> list[tuple[Any, Any, Any, Any]]:
    h, group = b.case.n_heads, b.case.n_heads // b.case.n_kv_heads
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, (_, length, start, _) in enumerate(b.segments):
        by_shape.setdefault((int(start), int(length)), []).append(i)
    calls = []
    for (start, length), members in by_shape.items():
        qs, ks, vs = [], [], []
        for i in members:
            packed, _, _, table = b.segments[i]
            q = b.q[packed:packed + length].reshape(length, h, HEAD_DIM).transpose(1, 0, 2)
            k = gather_history(b.k_pool, LAYER, b.page_tables[table], start + length)
            v = gather_history(b.v_pool, LAYER, b.page_tables[table], start + length)
            heads = lambda x: np.repeat(  # noqa: E731
                x.reshape(start + length, -1, HEAD_DIM).transpose(1, 0, 2), group, axis=0)
            qs.append(q)
            ks.append(heads(k))
            vs.append(heads(v))
        dev = lambda xs: torch.tensor(np.stack(xs), dtype=torch.float32, device="cuda")  # noqa: E731
        mask = None
        if start:
            cols = torch.arange(start + length, device="cuda")
            rows = torch.arange(length, device="cuda")[:, None]
            mask = cols[None, :] <= rows + start
        calls.append((dev(qs).contiguous(), dev(ks).contiguous(), dev(vs).contiguous(), mask))
    return calls


def sdpa_microseconds(b: HostBatch, iters: int, trials: int) -> dict[str, Any] | None:
    try:
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: PLC0415, N812
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    calls = _calls(b, torch)

    def step() -> None:
        for q, k, v, mask in calls:
            if mask is None:
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    method, graph = "graph", None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(iters):
                step()
    except Exception:  # noqa: BLE001 - a peer that cannot be captured is timed eagerly
        method, graph = "eager", None
    values = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            if graph is not None:
                graph.replay()
            start.record()
            if graph is not None:
                graph.replay()
            else:
                for _ in range(iters):
                    step()
            end.record()
        end.synchronize()
        values.append(start.elapsed_time(end) * 1000.0 / iters)
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values, "method": method}
