"""``llm-engine gpu-engine-check``: the CuPy backend against the numpy oracle and itself.

Checks (each prints a count; any failure exits non-zero):
  linear    row (decode) and tiled GEMM kernels give identical bits for every M (f32 and
            int8), and agree with a float64 product within tolerance; the chunk-parallel
            decode GEMM == tiled for M = 1..64 (checks/chunks_check.py);
  chunks    rmsnorm + chunk SwiGLU == the fused row kernel; the chunk order model and its
            negative control; chunk GEMMs replayed from a CUDA graph == eager;
  fused     each fused row kernel == its stages run as separate kernels (bitwise);
  agree     GPU logits vs the numpy backend on tiny random models (G = 3 and 4);
  needle    a request alone == the same request inside random packed batches (bitwise);
  chunked   chunked prefill (several chunkings) and decode == one-shot prefill (bitwise);
  online    negative control: an online attention variant gives different bits;
  graphs    decode steps replayed from CUDA graphs (padded to a bucket) == eager, bitwise,
            for batch sizes across the bucket edges;
  stack     the batch-1 decode stack == the five-kernel layers, per kernel and per step,
            with a negative control (checks/stack_check.py);
  model     (with --model) greedy text of the default model contains "Paris", and its
            GPU logits agree with the CPU path.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.checks.chunks_check import check_chunks, check_chunks_linear
from crucible.checks.stack_check import check_stack
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import tiny_random_model

GEOMS = {"g4-12/3": dict(n_heads=12, n_kv_heads=3, head_dim=64, hidden_size=192, ffn_size=256),
         "g3-9/3": dict(n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=192, ffn_size=256)}


class Tally:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {what}", flush=True)


def check_linear(t: Tally, rng: np.random.Generator) -> None:
    import cupy as cp

    from crucible.kernels import linear as ck
    from crucible.kernels.device_weight import upload_weight
    from crucible.model.weights import quantize_int8

    for n, k in [(960, 576), (576, 1536), (300, 96), (70, 100), (49152, 576)]:
        w = rng.standard_normal((n, k)).astype(np.float32)
        x = rng.standard_normal((300, k)).astype(np.float32)
        qw = quantize_int8(w)
        for label, wd, ref_w in [("f32", upload_weight(w), w),
                                 ("int8", upload_weight(qw.q, qw.scale), qw.dequantize())]:
            xd = cp.asarray(x)
            full = cp.asnumpy(ck.linear(xd, wd, cp.empty((300, n), cp.float32)))  # tiled
            for m in (1, 2, 3, 4, 5, 8, 9, 15, 16, 17, 33, 64, 65, 127, 128, 129, 200, 300):
                part = cp.asnumpy(ck.linear(cp.asarray(x[-m:]), wd, cp.empty((m, n), cp.float32)))
                t.check(np.array_equal(part, full[-m:]), f"linear {label} {n}x{k} M={m}")
            want = x.astype(np.float64) @ ref_w.astype(np.float64).T
            err = np.abs(full - want).max() / max(1.0, np.abs(want).max())
            t.check(err < 1e-5, f"linear {label} {n}x{k} vs float64: rel err {err:.2e}")
    check_chunks_linear(t, rng)


def check_fused(t: Tally, name: str, geom: dict, rng: np.random.Generator) -> None:
    """Each fused row kernel (norm+QKV+RoPE+store, norm+gate/up+SwiGLU, norm+LM head) ==
    the same stages as separate kernels, bitwise, including what lands in the pool."""
    import cupy as cp

    from crucible.backend import stages

    model = tiny_random_model(seed=7, **geom)
    cfg = model.config
    gpu = ModelRunner(model, num_pages=600, device="cuda")
    be = gpu.backend
    for m in (1, 2, 3, 4, 5, 8, 9, 33, 128):
        free = rng.permutation(600).tolist()
        batch = build_packed_batch([
            SegmentSpec(f"r{i}", [int(rng.integers(0, cfg.vocab_size))],
                        int(rng.integers(0, 64)), [free.pop() for _ in range(4)], [0])
            for i in range(m)])
        meta = be.prepare(batch)
        x = cp.asarray(rng.standard_normal((m, cfg.hidden_size)).astype(np.float32))
        layer = int(rng.integers(0, cfg.n_layers))
        k0, v0 = be.k_pool.copy(), be.v_pool.copy()
        q_fused = be.attn_in(x, layer, meta)
        kf, vf = be.k_pool.copy(), be.v_pool.copy()
        be.k_pool[...], be.v_pool[...] = k0, v0
        q_sep = stages.attn_in(be, x, layer, meta)
        same = (bool(cp.array_equal(q_fused, q_sep)) and bool(cp.array_equal(kf, be.k_pool))
                and bool(cp.array_equal(vf, be.v_pool)))
        t.check(same and not bool(cp.array_equal(kf, k0)), f"{name} fused attn_in M={m}")
        t.check(bool(cp.array_equal(be.mlp_in(x, layer), stages.mlp_in(be, x, layer))),
                f"{name} fused mlp_in M={m}")
        sep = be.linear(be.rmsnorm(x, "final_norm"), "lm_head")
        t.check(bool(cp.array_equal(be.norm_linear(x, "final_norm", "lm_head"), sep)),
                f"{name} fused norm+lm_head M={m}")


def _alone(runner: ModelRunner, tokens: list[int], pages: list[int]) -> np.ndarray:
    return runner.forward(build_packed_batch(
        [SegmentSpec("r", tokens, 0, pages, list(range(len(tokens))))]))


def check_model(t: Tally, name: str, geom: dict, rng: np.random.Generator, variant: str) -> None:
    model = tiny_random_model(seed=3, **geom)
    vocab = model.config.vocab_size
    gpu = ModelRunner(model, num_pages=96, device="cuda")
    cpu = ModelRunner(model, num_pages=96, device="cpu")
    for n in (1, 17, 64, 130, 300):
        tokens = rng.integers(0, vocab, n).tolist()
        pages = rng.permutation(96)[: -(-n // 16)].tolist()
        a, b = _alone(gpu, tokens, pages), _alone(cpu, tokens, pages)
        err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        t.check(err < 1e-4, f"{name} agree n={n}: rel err {err:.2e}")
    needle = rng.integers(0, vocab, 70).tolist()
    alone = _alone(gpu, needle, [90, 91, 92, 93, 94])
    for trial in range(8):
        free = rng.permutation(90).tolist()
        specs, where = [], int(rng.integers(0, 6))
        for i in range(6):
            if i == where:
                specs.append(SegmentSpec("needle", needle, 0, [free.pop() for _ in range(5)],
                                         list(range(70))))
                continue
            m = int(rng.integers(1, 100))
            specs.append(SegmentSpec(f"n{i}", rng.integers(0, vocab, m).tolist(), 0,
                                     [free.pop() for _ in range(-(-m // 16))], [m - 1]))
        out = gpu.forward(build_packed_batch(specs))
        t.check(np.array_equal(out[where : where + 70], alone), f"{name} needle trial {trial}")
    for chunks in ([70], [1] * 70, [16, 16, 16, 22], [37, 33], [7, 3, 31, 4, 25]):
        got, start = [], 0
        pages = [11, 3, 40, 7, 60]
        for c in chunks:
            got.append(gpu.forward(build_packed_batch(
                [SegmentSpec("c", needle[start : start + c], start, pages, list(range(c)))])))
            start += c
        t.check(np.array_equal(np.concatenate(got), alone), f"{name} chunks {chunks[:5]}")
    if variant:
        online = ModelRunner(model, num_pages=96, device="cuda", attention=variant)
        diff = _alone(online, needle, [90, 91, 92, 93, 94])
        t.check(not np.array_equal(diff, alone), f"{name} {variant} must differ from exact")


def check_graphs(t: Tally, name: str, geom: dict, rng: np.random.Generator) -> None:
    """Decode graphs (padded to buckets) == eager decode, bitwise, across bucket edges."""
    model = tiny_random_model(seed=5, **geom)
    vocab = model.config.vocab_size
    gpu = ModelRunner(model, num_pages=400, device="cuda")
    be = gpu.backend
    n_req = 64
    lens = rng.integers(1, 90, n_req).tolist()
    free = rng.permutation(400).tolist()
    tables = [[free.pop() for _ in range(-(-(n + 16) // 16))] for n in lens]
    gpu.forward(build_packed_batch([
        SegmentSpec(f"r{i}", rng.integers(0, vocab, n).tolist(), 0, tables[i], [n - 1])
        for i, n in enumerate(lens)]))
    pos = list(lens)
    for b in (1, 2, 3, 7, 15, 16, 17, 24, 31, 33, 48, 63, 64):
        who = rng.permutation(n_req)[:b].tolist()
        batch = build_packed_batch([SegmentSpec(f"r{i}", [int(rng.integers(0, vocab))], pos[i],
                                                tables[i], [0]) for i in who])
        graphs, be.graphs = be.graphs, None
        eager = gpu.forward(batch)
        be.graphs = graphs
        replay = gpu.forward(batch)
        t.check(np.array_equal(eager, replay), f"{name} graph == eager, batch {b}")
        for i in who:
            pos[i] += 1
    t.check(be.graphs.num_replays >= 13 and be.graphs.num_captures >= 1,
            f"{name} graphs replayed ({be.graphs.num_captures} captures)")
    # Changing the attention variant drops every graph; the next replay runs the new kernels.
    be.set_variant("online-q2-k32")
    t.check(not be.graphs.graphs and not be.prefill_graphs.graphs,
            f"{name} variant change dropped the graphs")
    t.check(not np.array_equal(gpu.forward(batch), replay),
            f"{name} graphs recaptured with the new variant (online differs)")
    be.set_variant("exact-q4-k64")


def check_default_model(t: Tally, spec: str) -> None:
    from crucible.model.loader import load_model

    model = load_model(spec, "int8")
    ids = model.tokenizer.encode("The capital of France is")
    gpu = ModelRunner(model, num_pages=64, device="cuda")
    cpu = ModelRunner(model, num_pages=64, device="cpu")
    a, b = _alone(gpu, ids, [5, 2]), _alone(cpu, ids, [5, 2])
    err = np.abs(a - b).max() / np.abs(b).max()
    print(f"default model int8: GPU vs CPU max rel logit diff {err:.2e}")
    t.check(err < 1e-4, f"default model GPU vs CPU rel err {err:.2e}")
    toks, pages = list(ids), [5, 2]
    out = []
    logits = a[-1:]
    for i in range(8):
        nxt = int(np.argmax(logits[0]))
        out.append(nxt)
        logits = gpu.forward(build_packed_batch([SegmentSpec("d", [nxt], len(toks), pages, [0])]))
        toks.append(nxt)
    text = model.tokenizer.decode(out)
    print(f"default model greedy: {text!r}")
    t.check("Paris" in text, "default model says Paris")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llm-engine gpu-engine-check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="also check this model (e.g. a .gguf path)")
    p.add_argument("--online", default="online-q2-k32", help="negative-control variant ('' off)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    t = Tally()
    t0 = time.time()
    check_linear(t, rng)
    check_chunks(t, rng)
    for name, geom in GEOMS.items():
        check_fused(t, name, geom, rng)
        check_model(t, name, geom, rng, args.online)
        check_graphs(t, name, geom, rng)
    check_stack(t, rng, GEOMS)
    if args.model:
        check_default_model(t, args.model)
    print(f"gpu-engine-check: {t.passed} passed, {t.failed} failed ({time.time() - t0:.1f} s)")
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
