"""The large-M GEMM (cuda/linear_wide.cu) against linear_tiled, with cuBLAS f32 (x @ W.T on
the dequantised weight) as the ceiling, on the default model's shapes, int8 weights.

    PYTHONPATH=$PWD python3 bench/gemm_bench.py [--json PATH] [--rounds 7] [--ms 15] [--sweep]

Shapes (SmolLM2-135M): qkv 960x576, o 576x576 (+residual), gate_up 3072x576, down 576x1536
(+residual), LM head 49152x576, at M = 128, 512, 1024, 2048 rows. Timing: each kernel's
launch is captured ``reps`` times back to back in one CUDA graph (no host gaps between
launches), after a warm-up; CUDA events around one replay give the time per launch; reps
makes a replay last about ``--ms`` ms. Each round times every kernel once, in alternating
order (A, B, C then C, B, A); figures are min and median over ``--rounds`` rounds. Before
timing a shape, the wide kernel's output must equal linear_tiled's bit for bit (asserted).
``--sweep`` also times every built form of the wide kernel (linear_wide.FORMS) per shape:
the data behind linear_wide.pick_form. ``--chunks`` also times the chunk kernel
(cuda/linear_chunks.cu, row blocks of 64 past 64 rows) at 32 and 64 columns a tile against
what ``linear()`` picks now, its bits asserted equal to linear_tiled's: the data behind
linear_chunks.use_chunks (the LM head is left out: its partials would not fit). Caveat: back-to-back launches of one GEMM find its
weights and activations in the L2, which a real step (30 layers) only partly does; at these
M the GEMMs are compute-bound, so that matters little.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import numpy as np

from common import SMOLLM2, stat, write_json

from crucible.kernels import linear as ck
from crucible.kernels import linear_chunks as cc
from crucible.kernels import linear_wide as lw
from crucible.kernels.device_weight import DeviceWeight

H, F, V = SMOLLM2["hidden_size"], SMOLLM2["ffn_size"], SMOLLM2["vocab_size"]
KV = SMOLLM2["n_kv_heads"] * SMOLLM2["head_dim"]
SHAPES = {  # name: (N, K, residual), as the model runs them
    "qkv": (H + 2 * KV, H, False), "o": (H, H, True), "gate_up": (2 * F, H, False),
    "down": (H, F, True), "lm_head": (V, H, False),
}
MS = (128, 512, 1024, 2048)


def int8_weight(n: int, k: int, rng: np.random.Generator) -> tuple[DeviceWeight, Any]:
    """Random int8 codes + scales (both layouts), and the f32 weight they stand for."""
    import cupy as cp

    codes = np.clip(np.rint(rng.standard_normal((n, k)) * 40), -127, 127).astype(np.int8)
    scale = (rng.random(n) * 0.02 + 0.001).astype(np.float32)
    wd = DeviceWeight(cp.asarray(np.ascontiguousarray(codes.T)), cp.asarray(codes),
                      cp.asarray(scale))
    return wd, cp.asarray(codes.astype(np.float32) * scale[:, None])


def graph_of(fn: Callable[[], Any], reps: int, stream: Any) -> Any:
    with stream:
        stream.begin_capture()
        try:
            for _ in range(reps):
                fn()
        finally:
            graph = stream.end_capture()
    return graph


def launch_ms(fn: Callable[[], Any], stream: Any) -> float:
    import cupy as cp

    with stream:
        fn()  # warm-up: compiles, sets the shared-memory opt-in
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        for _ in range(3):
            fn()
        b.record(stream)
        b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / 3


class Timer:
    """One kernel as a graph of back-to-back launches; ``once()`` is ms per launch. A kernel
    that cannot be captured is launched eagerly ``reps`` times between the events."""

    def __init__(self, fn: Callable[[], Any], target_ms: float, stream: Any) -> None:
        self.fn, self.stream = fn, stream
        self.reps = int(min(400, max(3, target_ms / max(launch_ms(fn, stream), 1e-3))))
        try:
            self.graph = graph_of(fn, self.reps, stream)
            self.graph.launch(stream)  # warm replay
        except Exception as e:  # noqa: BLE001 - timed eagerly instead
            print(f"   (not captured, timed eagerly: {e})", flush=True)
            self.graph = None
        stream.synchronize()

    def once(self) -> float:
        import cupy as cp

        a, b = cp.cuda.Event(), cp.cuda.Event()
        with self.stream:
            a.record(self.stream)
            if self.graph is not None:
                self.graph.launch(self.stream)
            else:
                for _ in range(self.reps):
                    self.fn()
            b.record(self.stream)
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) / self.reps


def measure(fns: dict[str, Callable[[], Any]], rounds: int, target_ms: float,
            stream: Any) -> dict[str, list[float]]:
    timers = {name: Timer(fn, target_ms, stream) for name, fn in fns.items()}
    names, ms = list(timers), {name: [] for name in timers}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            ms[name].append(timers[name].once())
    return ms


def tflops(m: int, n: int, k: int, ms: list[float]) -> list[float]:
    return [2.0 * m * n * k / (t * 1e-3) / 1e12 for t in ms]


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ms", type=float, default=15.0, help="target ms per timed replay")
    ap.add_argument("--sweep", action="store_true", help="also time every built form")
    ap.add_argument("--chunks", action="store_true", help="also time the chunk kernel")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--m", default=",".join(map(str, MS)))
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    rows, sweep, chunks = [], [], []
    for name in a.shapes.split(","):
        n, k, with_res = SHAPES[name]
        wd, wf = int8_weight(n, k, rng)
        for m in map(int, a.m.split(",")):
            x = cp.asarray(rng.standard_normal((m, k)), dtype=cp.float32)
            res = cp.asarray(rng.standard_normal((m, n)), dtype=cp.float32) if with_res else None
            outs = [cp.full((m, n), cp.nan, cp.float32) for _ in range(3)]
            new = lw.linear_wide(x, wd, outs[0], res)
            old = ck.linear_tiled(x, wd, outs[1], res)
            assert bool(cp.array_equal(new.view(cp.uint32), old.view(cp.uint32))), \
                f"{name} M={m}: the wide kernel's bits differ from linear_tiled's"
            wt_f = wf.T
            fns = {"wide": lambda: lw.linear_wide(x, wd, outs[0], res),
                   "tiled": lambda: ck.linear_tiled(x, wd, outs[1], res),
                   "cublas_f32": lambda: cp.matmul(x, wt_f, out=outs[2])}  # no residual
            ms = measure(fns, a.rounds, a.ms, stream)
            t = {key: stat(tflops(m, n, k, v)) for key, v in ms.items()}
            rows.append(dict(shape=name, M=m, N=n, K=k, residual=with_res,
                             form=list(lw.pick_form(m, n, k)), tflops=t,
                             ratio_wide_over_tiled=t["wide"]["median"] / t["tiled"]["median"]))
            print(f"{name:8s} M={m:5d} form={lw.pick_form(m, n, k)} "
                  f"wide {t['wide']['median']:6.1f} tiled {t['tiled']['median']:6.1f} "
                  f"cublas {t['cublas_f32']['median']:6.1f} TFLOP/s", flush=True)
            if a.chunks and name != "lm_head" and m <= cc.CHUNKS_MAX_ROWS:
                for nt in cc.NT_CHOICES:
                    got = cc.linear_chunks(x, wd, outs[0], res, nt=nt)
                    assert bool(cp.array_equal(got.view(cp.uint32), old.view(cp.uint32))), \
                        f"{name} M={m} nt={nt}: the chunk kernel's bits differ from tiled's"
                cfns = {"picked": lambda: ck.linear(x, wd, outs[1], res),
                        **{f"chunks{nt}": (lambda nt=nt: cc.linear_chunks(x, wd, outs[0], res,
                                                                          nt=nt))
                           for nt in cc.NT_CHOICES}}
                cm = measure(cfns, a.rounds, a.ms, stream)
                ct = {key: stat(tflops(m, n, k, v))["median"] for key, v in cm.items()}
                chunks.append(dict(shape=name, M=m, N=n, K=k, tflops=ct,
                                   best_chunks_over_picked=max(ct["chunks32"], ct["chunks64"])
                                   / ct["picked"]))
                print("   chunks: " + " ".join(f"{key} {v:.1f}" for key, v in ct.items()),
                      flush=True)
            if a.sweep:
                forms = {f"{bm}x{bn}g{g}k{wk}": (lambda f=(bm, bn, g, wk): lw.linear_wide(
                    x, wd, outs[0], res, form=f)) for bm, bn, g, wk in lw.FORMS}
                sm = measure(forms, max(3, a.rounds // 2), a.ms, stream)
                med = {key: stat(tflops(m, n, k, v))["median"] for key, v in sm.items()}
                best = max(med, key=med.get)
                sweep.append(dict(shape=name, M=m, N=n, K=k, best=best, tflops=med))
                print("   sweep: " + " ".join(f"{key} {v:.1f}" for key, v in
                                              sorted(med.items(), key=lambda kv: -kv[1])),
                      flush=True)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    result = dict(command=" ".join([sys.executable, *sys.argv]), device=props["name"].decode(),
                  rounds=a.rounds, target_ms=a.ms, weights="int8", results=rows)
    if sweep:
        result["sweep"] = sweep
    if chunks:
        result["chunks"] = chunks
    if a.json:
        write_json(a.json, result)
    print(f"\n{'shape':8s} {'M':>5s} {'form':>12s} {'wide':>12s} {'tiled':>12s} "
          f"{'cublas':>7s} {'x':>5s}   (TFLOP/s median / min)")
    for r in rows:
        t = r["tflops"]
        print(f"{r['shape']:8s} {r['M']:5d} {str(tuple(r['form'])):>12s} "
              f"{t['wide']['median']:5.1f}/{t['wide']['min']:5.1f} "
              f"{t['tiled']['median']:5.1f}/{t['tiled']['min']:5.1f} "
              f"{t['cublas_f32']['median']:7.1f} {r['ratio_wide_over_tiled']:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
