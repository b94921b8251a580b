"""The chunk-parallel decode GEMM (cuda/linear_chunks.cu) on the GPU, part of gpu-engine-check.

  linear  == the tiled kernel, bitwise, for every M in 1..64, f32 and int8, both tile
          widths, store / store + residual / SwiGLU (against tiled + swiglu_rows);
  fused   rmsnorm_rows + the SwiGLU form == the fused norm+gate/up+SwiGLU row kernel;
  order   the partials left in the scratch, added on the host in ascending chunk order,
          give the kernel's output bit for bit; negative control: descending order must not;
  graph   a layer's decode GEMMs captured in a CUDA graph (PDL launches) and replayed
          several times == eager, bitwise (the counters come back to zero every launch).

Comparisons are of bit patterns (0.0 and -0.0 differ). ``finish_partials`` is the numpy
model of the kernel's finisher; the CPU tests drive it with exactly rounded partials.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SHAPES = ((3072, 576), (576, 1536), (576, 576), (960, 576), (70, 112))  # (N, K); 70: tails
BLOCK_ROWS = (65, 100, 128, 191, 256, 300, 512)  # row blocks of 64: full and partial last ones


def finish_partials(part: np.ndarray, n: int, scale: np.ndarray | None = None,
                    residual: np.ndarray | None = None, descending: bool = False) -> np.ndarray:
    """The store epilogue of linear_chunks.cu on the host: ``part`` [tiles, chunks, M, NT]
    (the scratch layout) -> y [M, n]. Chunk partials add in ascending order (descending
    for the negative control), then scale, then the residual; each step one f32 rounding."""
    tiles, chunks, m, nt = part.shape
    order = list(range(chunks))[::-1] if descending else list(range(chunks))
    total = part[:, order[0]].astype(np.float32)
    for c in order[1:]:
        total = total + part[:, c]
    y = total.transpose(1, 0, 2).reshape(m, tiles * nt)[:, :n]
    if scale is not None:
        y = y * scale.astype(np.float32)[None, :]
    if residual is not None:
        y = residual.astype(np.float32) + y
    return np.ascontiguousarray(y, dtype=np.float32)


def _same(a: Any, b: Any) -> bool:
    import cupy as cp

    return a.shape == b.shape and bool(cp.array_equal(a.view(cp.uint32), b.view(cp.uint32)))


def _weights(rng: np.random.Generator, n: int, k: int) -> list[tuple[str, Any]]:
    from crucible.kernels.device_weight import upload_weight
    from crucible.model.weights import quantize_int8

    w = rng.standard_normal((n, k)).astype(np.float32)
    qw = quantize_int8(w)
    return [("f32", upload_weight(w)), ("int8", upload_weight(qw.q, qw.scale))]


def _swiglu(gate_up: Any) -> Any:
    import cupy as cp

    from crucible.kernels.model_ops import flat_launch

    f = gate_up.shape[1] // 2
    y = cp.empty((gate_up.shape[0], f), cp.float32)
    flat_launch("swiglu_rows", y.size, (gate_up, y, np.int32(f), np.int64(y.size)))
    return y


def check_chunks_linear(t: Any, rng: np.random.Generator) -> None:
    """linear_chunks == linear_tiled bitwise for M = 1..64 (forced on below CHUNKS_FROM)
    and for M past 64 in row blocks of 64, the last one full or partial."""
    import cupy as cp

    from crucible.kernels import linear_chunks as cc
    from crucible.kernels import linear as ck

    rows = list(range(1, 65)) + list(BLOCK_ROWS)
    top = max(rows)
    for n, k in SHAPES:
        x = cp.asarray(rng.standard_normal((top, k)).astype(np.float32))
        res = cp.asarray(rng.standard_normal((top, n)).astype(np.float32))
        for label, wd in _weights(rng, n, k):
            plain = ck.linear_tiled(x, wd, cp.empty((top, n), cp.float32))
            added = ck.linear_tiled(x, wd, cp.empty((top, n), cp.float32), res)
            act = _swiglu(plain)
            for nt in cc.NT_CHOICES:
                bad: dict[str, list[int]] = {"store": [], "residual": [], "swiglu": []}
                for m in rows:
                    xm, rm = x[:m], res[:m]  # leading rows: contiguous and aligned
                    got = cc.linear_chunks(xm, wd, cp.empty((m, n), cp.float32), nt=nt)
                    if not _same(got, plain[:m]):
                        bad["store"].append(m)
                    got = cc.linear_chunks(xm, wd, cp.empty((m, n), cp.float32), rm, nt=nt)
                    if not _same(got, added[:m]):
                        bad["residual"].append(m)
                    got = cc.linear_chunks(xm, wd, cp.empty((m, n // 2), cp.float32),
                                           epi=cc.EPI_SWIGLU, nt=nt)
                    if not _same(got, act[:m]):
                        bad["swiglu"].append(m)
                for form, ms in bad.items():
                    t.check(not ms, f"chunks {label} {n}x{k} nt={nt} {form} == tiled "
                            f"(differs at M={ms[:8]})")
    s = cc.current_scratch()
    t.check(s is not None and not bool(s.counters.any()), "chunks counters back to zero")


def check_chunks_fused(t: Any, rng: np.random.Generator) -> None:
    """rmsnorm_rows + the chunk kernel's SwiGLU form == the fused row kernel, bitwise."""
    import cupy as cp

    from crucible.kernels import linear_chunks as cc
    from crucible.kernels import linear_rows as cf
    from crucible.kernels.model_ops import rows_launch

    eps = 1e-5
    for n, k in ((3072, 576), (512, 192)):  # SmolLM2's gate/up; the tiny test models'
        norm = cp.asarray((1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32))
        for label, wd in _weights(rng, n, k):
            for m in (16, 33, 64):
                x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
                fused = cf.linear_rows(x, wd, cp.empty((m, n // 2), cp.float32), norm=norm,
                                       eps=eps, epi=cf.EPI_SWIGLU)
                xn = cp.empty_like(x)
                rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(k), np.float32(eps)))
                for nt in cc.NT_CHOICES:
                    got = cc.linear_chunks(xn, wd, cp.empty((m, n // 2), cp.float32),
                                           epi=cc.EPI_SWIGLU, nt=nt)
                    t.check(_same(got, fused), f"chunks norm+swiglu {label} {n}x{k} nt={nt} "
                            f"M={m} == fused row kernel")


def check_chunks_order(t: Any, rng: np.random.Generator) -> None:
    """The scratch's partials, finished on the host: ascending == the kernel; descending
    (the negative control) must differ somewhere. numpy's f32 add and multiply round as
    __fadd_rn and __fmul_rn do, and the data has no denormals."""
    import cupy as cp

    from crucible.kernels import linear_chunks as cc

    for n, k, with_res in ((576, 1536, True), (960, 576, False), (70, 112, True)):
        for label, wd in _weights(rng, n, k):
            for m in (17, 64):
                x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
                res = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
                nt = cc.chunks_nt(n, k)
                got = cp.asnumpy(cc.linear_chunks(x, wd, cp.empty((m, n), cp.float32),
                                                  res if with_res else None, nt=nt))
                tiles, chunks = cc.tile_count(n, nt, cc.EPI_STORE), cc.chunk_count(k)
                part = cp.asnumpy(cc.current_scratch().part[: tiles * chunks * m * nt])
                part = part.reshape(tiles, chunks, m, nt)
                scale = None if wd.scale is None else cp.asnumpy(wd.scale)
                r = cp.asnumpy(res) if with_res else None
                up = finish_partials(part, n, scale, r)
                down = finish_partials(part, n, scale, r, descending=True)
                what = f"chunks order {label} {n}x{k} M={m}"
                t.check(np.array_equal(up.view(np.uint32), got.view(np.uint32)),
                        f"{what}: host ascending sum of the partials == kernel")
                if chunks >= 3:  # two partials add the same either way round
                    t.check(not np.array_equal(down.view(np.uint32), got.view(np.uint32)),
                            f"{what}: negative control (descending order) must differ")


def check_chunks_graph(t: Any, rng: np.random.Generator) -> None:
    """norm -> gate/up SwiGLU -> down + residual -> O + residual, captured with PDL launches
    on a stream of its own, replayed 3 times: each replay == the eager run, bitwise."""
    import cupy as cp

    from crucible.kernels import linear_chunks as cc
    from crucible.kernels.model_ops import rows_launch

    d, f = 576, 1536
    sets = [dict(_weights(rng, n, k)) for n, k in ((2 * f, d), (d, f), (d, d))]
    for label in ("f32", "int8"):
        gate_up, down, o = (ws[label] for ws in sets)
        norm = cp.asarray((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        for m in (16, 40, 64):
            x = cp.asarray(rng.standard_normal((m, d)).astype(np.float32))

            def layer() -> list[Any]:  # every intermediate kept: the graph writes them all
                xn = cp.empty_like(x)
                rows_launch("rmsnorm_rows", m, (x, norm, xn, np.int32(d), np.float32(1e-5)))
                act = cc.linear_chunks(xn, gate_up, cp.empty((m, f), cp.float32),
                                       epi=cc.EPI_SWIGLU, pdl=True)
                h = cc.linear_chunks(act, down, cp.empty((m, d), cp.float32), x, pdl=True)
                return [cc.linear_chunks(h, o, cp.empty((m, d), cp.float32), h, pdl=True), act,
                        h, xn]

            want = layer()[0]
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                layer()  # warm-up: this stream's scratch is allocated outside the capture
                stream.synchronize()
                stream.begin_capture()
                held = layer()
                graph = stream.end_capture()
                ok = True
                for _ in range(3):
                    held[0].fill(0)
                    graph.launch(stream)
                    stream.synchronize()
                    ok = ok and _same(held[0], want)
            t.check(ok, f"chunks graph replays == eager {label} M={m}")


def check_chunks(t: Any, rng: np.random.Generator) -> None:
    check_chunks_fused(t, rng)
    check_chunks_order(t, rng)
    check_chunks_graph(t, rng)
