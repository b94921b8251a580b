"""GPU decode and prefill speed of the CuPy backend (eager vs decode graphs).

    python3 bench/gpu_generate.py --model PATH [--weights int8] [--rounds 3] [--json PATH]

Decode: batches of 1 and 64 requests with 128-token histories; per round, four modes run in
alternating order: eager, decode graphs, decode graphs with programmatic dependent launch
(PDL), and the last pipelined (step t+1 queued before step t's ids are read; its input ids
come from the device); batch 1 also runs pipelined with the decode stack off. A step is timed from building its packed batch on the host to the
sampled ids on the host (greedy, sampled on the device, each step fed the previous step's
ids; pipelined: steps per second over the whole run); then the same
through LLMEngine (scheduler, validation, sampling on the device, detokenizing, pipelining;
the second of two identical runs, so graph captures are excluded), which is what the
engine's users get (``--parts sampled``: also with temperature sampling, and the share of
steps queued before the previous step's ids came back). Prefill: one prompt of 64, 256 and
1,024 tokens (time to logits of its last row), singleton prefill graphs on and off
alternating, and 16 x 64 packed (eager).
Warm-up steps (compilation, graph capture) are excluded. Figures: median and min-max over
rounds. Ratios are paired within a round.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from common import stat, write_json

from crucible.kernels import launch as pdl_launch
from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.engine.settings import Settings
from crucible.model.loader import load_model
from crucible.engine.runner import ModelRunner


# decode graphs off; on without PDL; on with PDL; the last, pipelined (step t+1 queued
# before step t's ids are read, its input ids fed on the device: crucible/engine/pipeline.py)
MODES = ("eager", "graph", "graph_pdl", "graph_pdl_pipe")
# Batch 1 also runs pipelined with the decode stack off (five kernels per layer instead of
# three: crucible/kernels/decode_stack.py), the stack's baseline in the same round.
B1_MODES = MODES + ("graph_pdl_pipe_layers",)


def set_mode(runner: ModelRunner, mode: str, graphs: object) -> None:
    """Graphs on or off, and PDL for the graphs captured next (set_pdl drops old graphs)."""
    be = runner.backend
    be.graphs = None if mode == "eager" else graphs
    be.set_pdl(mode.startswith("graph_pdl"))
    be.set_decode_stack(not mode.endswith("_layers"))


def decode_rate(runner: ModelRunner, batch_size: int, steps: int, rng: np.random.Generator,
                pipelined: bool = False) -> float:
    """tok/s of decode steps as the engine runs them: the packed batch built on the host,
    the forward, greedy sampling on the device, the ids back on the host. Pipelined: step
    p + 1 is queued (its ids fed on the device) before step p's ids are read."""
    from crucible.step.rows import row_sampling
    from crucible.engine.sampling import SamplingParams

    vocab = runner.config.vocab_size
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(batch_size)]
    runner.forward(build_packed_batch([
        SegmentSpec(f"r{i}", rng.integers(0, vocab, 128).tolist(), 0, tables[i], [127])
        for i in range(batch_size)]))
    greedy = SamplingParams(temperature=0.0)
    rows = [row_sampling(i, greedy, prompt=(), output=(), seed=0, stop_ids=(), vocab_size=vocab)
            for i in range(batch_size)]
    toks = [7] * batch_size

    def decode_batch(p: int, ids: list[int]) -> object:
        return build_packed_batch([SegmentSpec(f"r{i}", [ids[i]], p, tables[i], [0])
                                   for i in range(batch_size)])

    def step(p: int) -> None:
        nonlocal toks
        toks = list(runner.forward_sample(decode_batch(p, toks), rows)[0].token_ids)

    step(128)
    step(129)  # warm-up (and capture when graphs are on)
    t = time.perf_counter()
    if pipelined:  # the ids fed on the device: the batch's own ids are placeholders
        feed = np.arange(batch_size, dtype=np.int32)
        pend = runner.launch_sample(decode_batch(130, toks), rows)
        for p in range(131, 130 + steps):
            nxt = runner.launch_sample(decode_batch(p, [0] * batch_size), rows, feed=feed)
            pend.result()
            pend = nxt
        pend.result()
    else:
        for p in range(130, 130 + steps):
            step(p)
    return batch_size * steps / (time.perf_counter() - t)

def engine_rate(runner: ModelRunner, tokenizer: object, batch_size: int, new: int,
                rng: np.random.Generator, sampling: dict | None = None,
                chained: list[float] | None = None) -> float:
    """Decode tok/s through LLMEngine (scheduler, validation, device sampling, detokenizing,
    pipelining): what a user of the engine gets. Greedy unless ``sampling`` (SamplingParams
    fields) says otherwise, 128-token prompts. The workload runs twice and the second run
    is timed, so every graph it needs (each batch size as requests
    finish, each score capacity) was captured by the first: a server's steady state. Timing
    starts once every request has two output tokens (64 prompts take several prefill steps
    under the token budget); tokens counted are those generated after that. ``chained``
    gets the timed steps' share that was queued before the previous step's ids came back."""
    from crucible.engine.engine import LLMEngine
    from crucible.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=new, ignore_eos=True,
                            **({"temperature": 0.0} | (sampling or {})))
    prompts = [rng.integers(0, runner.config.vocab_size, 128).tolist() for _ in range(batch_size)]
    for _ in range(2):
        eng = LLMEngine(runner, tokenizer)
        for p in prompts:
            eng.add_request(p, params)
        while min(r.num_output_tokens for r in eng.requests.values()) < 2:
            eng.step()
        done, t = eng.num_generated, time.perf_counter()
        steps, links = eng.num_steps, eng.num_chained
        while eng.has_unfinished():
            eng.step()
        rate = (eng.num_generated - done) / (time.perf_counter() - t)
    if chained is not None:
        chained.append((eng.num_chained - links) / max(1, eng.num_steps - steps))
    return rate


def prefill_seconds(runner: ModelRunner, segs: list[tuple[int, int]],
                    rng: np.random.Generator, graphs: bool = True) -> float:
    be = runner.backend
    saved = getattr(be, "prefill_graphs", None)
    if saved is not None:
        be.prefill_graphs = saved if graphs else None
    vocab = runner.config.vocab_size
    specs, page = [], 0
    for i, (n, _) in enumerate(segs):
        npg = -(-n // 16)
        specs.append(SegmentSpec(f"p{i}", rng.integers(0, vocab, n).tolist(), 0,
                                 list(range(page, page + npg)), [n - 1]))
        page += npg
    batch = build_packed_batch(specs)
    runner.forward(batch)  # warm-up (and capture)
    t = time.perf_counter()
    runner.forward(batch)
    dt = time.perf_counter() - t
    if saved is not None:
        be.prefill_graphs = saved
    return dt


def profile(runner: ModelRunner, batch_size: int, prompt: int, rng: np.random.Generator,
            reps: int = 3) -> dict[str, float]:
    """Per-stage GPU ms of one eager step (min over reps): decode or a single prefill."""
    from crucible.backend.profile import ProfiledBackend
    from crucible.model import llama

    vocab = runner.config.vocab_size
    if prompt:
        batch = build_packed_batch([SegmentSpec("p", rng.integers(0, vocab, prompt).tolist(), 0,
                                                list(range(-(-prompt // 16))), [prompt - 1])])
    else:
        batch = build_packed_batch([SegmentSpec(f"r{i}", [7], 200, list(range(i * 16, i * 16 + 16)),
                                                [0]) for i in range(batch_size)])
    pb = ProfiledBackend(runner.backend)
    best: dict[str, float] = {}
    for _ in range(reps + 1):
        llama.forward(runner.config, pb, batch)
        ms = pb.stage_ms()
        best = {k: min(v, best.get(k, v)) for k, v in ms.items()} if best else ms
    return best


# --parts sampled: the engine's decode with these SamplingParams fields, in turn each round.
SAMPLED = (("greedy", {}), ("t07", {"temperature": 0.7}),
           ("chat", {"temperature": 0.8, "top_p": 0.95}))  # the CLI's sampling defaults


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--weights", default="int8", choices=("int8", "f32"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--json", default="bench/gpu-generate.json")
    p.add_argument("--gemm", default="fma", choices=("fma", "mma"),
                   help="the int8 GEMMs' order (CRUCIBLE_GEMM)")
    p.add_argument("--wgmma", action="store_true",
                   help="mma's GEMMs of 128 rows and more on the warpgroup MMA (CRUCIBLE_WGMMA=1); "
                   "without it, off (0), so both sides are explicit")
    p.add_argument("--parts", default="decode,engine,prefill,profile",
                   help="comma-separated subset of decode,engine,sampled,prefill,profile "
                        "(sampled: the engine's decode greedy, at temperature 0.7, and at "
                        "the CLI's 0.8 with top_p 0.95, in turn; not in the default)")
    p.add_argument("--row1-head", type=int, default=None, metavar="PB",
                   help="under --gemm mma, route one-row LM heads to linear_mma_row1.cu's "
                        "form PB (0: not at all; kernels/linear_mma.py ROW1_ROUTED, ROW1_FORMS)")
    p.add_argument("--rope-in", type=int, choices=(0, 1), default=None,
                   help="decode steps' RoPE and K/V store inside their attention (1, the "
                        "default) or in a launch of their own (0; kernels/attention.py ROPE_IN)")
    args = p.parse_args(argv)
    from crucible.kernels import attention, linear_mma

    if args.rope_in is not None:
        attention.ROPE_IN = bool(args.rope_in)

    if args.row1_head is not None:
        linear_mma.ROW1_ROUTED = args.row1_head > 0
        pb = (args.row1_head,)
        if args.row1_head > 0:
            assert pb in linear_mma.ROW1_FORMS, f"--row1-head: one of {linear_mma.ROW1_FORMS}"
            linear_mma.ROW1_FORMS = (pb,) + tuple(f for f in linear_mma.ROW1_FORMS if f != pb)
    model = load_model(args.model, args.weights)
    runner = ModelRunner(model, num_pages=1100, device="cuda",
                         settings=Settings(device="cuda", gemm=args.gemm, wgmma=args.wgmma))
    rng = np.random.default_rng(0)
    res: dict[str, list[float]] = {}
    graphs = runner.backend.graphs
    for r in range(args.rounds):
        for b in (1, 64) if "decode" in args.parts else ():
            modes = B1_MODES if b == 1 else MODES
            order = modes if r % 2 == 0 else modes[::-1]
            got = {}
            for mode in order:
                set_mode(runner, mode, graphs)
                got[mode] = decode_rate(runner, b, args.steps, rng, "_pipe" in mode)
            set_mode(runner, "graph_pdl", graphs)
            if b == 1:
                res.setdefault("decode_b1_stack_over_layers", []).append(
                    got["graph_pdl_pipe"] / got["graph_pdl_pipe_layers"])
            for mode in modes:
                res.setdefault(f"decode_b{b}_{mode}_tok_s", []).append(got[mode])
            res.setdefault(f"decode_b{b}_graph_over_eager", []).append(got["graph"] / got["eager"])
            res.setdefault(f"decode_b{b}_pdl_over_graph", []).append(got["graph_pdl"] / got["graph"])
            res.setdefault(f"decode_b{b}_pipe_over_pdl", []).append(
                got["graph_pdl_pipe"] / got["graph_pdl"])
        for b in (1, 64) if "engine" in args.parts else ():
            res.setdefault(f"engine_decode_b{b}_tok_s", []).append(
                engine_rate(runner, model.tokenizer, b, args.steps, rng))
        for b in (1, 64) if "sampled" in args.parts else ():  # beside greedy, in turn
            order = SAMPLED if r % 2 == 0 else SAMPLED[::-1]
            for name, fields in order:
                share: list[float] = []
                res.setdefault(f"engine_decode_b{b}_{name}_tok_s", []).append(
                    engine_rate(runner, model.tokenizer, b, args.steps, rng, fields, share))
                res.setdefault(f"engine_decode_b{b}_{name}_chained", []).append(share[0])
        if "prefill" not in args.parts:
            print(f"round {r}: " + ", ".join(f"{k}={v[-1]:.4g}" for k, v in res.items()),
                  file=sys.stderr, flush=True)
            continue
        for n in (64, 256, 1024):  # a lone prompt: singleton prefill graph vs eager
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {g: prefill_seconds(runner, [(n, 0)], rng, g) for g in order}
            res.setdefault(f"prefill_{n}_eager_s", []).append(got[False])
            res.setdefault(f"prefill_{n}_graph_s", []).append(got[True])
        res.setdefault("prefill_1024_s", []).append(min(res["prefill_1024_eager_s"][-1],
                                                       res["prefill_1024_graph_s"][-1]))
        res.setdefault("prefill_16x64_s", []).append(prefill_seconds(runner, [(64, 0)] * 16, rng))
        print(f"round {r}: " + ", ".join(f"{k}={v[-1]:.4g}" for k, v in res.items()),
              file=sys.stderr, flush=True)
    profiles = {}
    if "profile" in args.parts:
        profiles = {"decode_b1": profile(runner, 1, 0, rng),
                    "decode_b64": profile(runner, 64, 0, rng),
                    "prefill_1024": profile(runner, 0, 1024, rng)}
    for name, ms in profiles.items():
        print(f"profile {name}: total {sum(ms.values()):.3f} ms: " + ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1])), file=sys.stderr)
    out = {"command": "python3 bench/gpu_generate.py " + " ".join(argv or sys.argv[1:]),
           "weights": args.weights, "rounds": args.rounds, "decode_steps": args.steps,
           "pdl": pdl_launch.status(),
           "results": {k: stat(v) for k, v in res.items()},
           "profile_ms": profiles}
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
