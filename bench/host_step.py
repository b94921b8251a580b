"""Host time per engine step with instant kernels: what the engine's Python costs a step
when the device answers at once (issue: <= 1 ms at 256 running requests).

    python3 bench/host_step.py [--running 64,256,512] [--steps 200] [--rounds 5]
                               [--json PATH] [--profile] [--against REV]

An ``InstantRunner`` stands in for the GPU runner: it has a device sampler and pipelines
decode steps (``chain_rows`` 512) like the CuPy runner, and ``launch_sample`` answers at
once (no forward). Its ids spell an English text with a few accented letters, an emoji and
some Japanese (``TEXT``: 14 of its 405 tokens are pieces of a character), each request from
its own offset, so the detokenizer sees what a model's output gives it (it drew from the
batch's token ids before, which a pipelined step leaves at 0: every row drew one id, a
control character). ``--running``
requests of the tiny model's tokenizer (prompts 16-95 tokens, ``ignore_eos``, long
outputs) are all admitted first; then ``--steps`` steps are timed, each a decode step of
every running request. Four modes, in turn within a round:

- ``ids``: one delta per request, at its end (``LLM.generate``, ``final_only``);
- ``deltas``: a delta of token ids every step, no text (the server's engine process,
  ``LLMEngine.detokenize`` off: its front detokenises);
- ``text``: every delta detokenised (the in-process server, ``AsyncLLMEngine``);
- ``arrivals``: serving's shape instead, each request that ends replaced by a new one
  (prompts 30-800 tokens, 64-255 out), so most steps are pipelined mixed steps
  (``arrivals_ms``).

Figures: host ms per step (the process's CPU time, so other load on the machine does not
count), median and min-max over rounds, per running count. ``--profile`` prints the top of
a cProfile of one round of each mode.

``--against REV``: the same rounds on another commit, for an A/B in one run: each round
runs both sides in fresh processes (this file, with ``PYTHONPATH`` at a temporary git
worktree of REV for the baseline), alternating which goes first; figures per side and the
paired ratios baseline / this tree.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from common import stat, write_json

from crucible.backend.protocol import GRAPH_STATS
from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer
from crucible.step.rows import SampleOutput


class _Done:
    def __init__(self, out: SampleOutput, host: np.ndarray) -> None:
        self.value = (out, host)

    def result(self) -> tuple[SampleOutput, np.ndarray]:
        return self.value


# What the sampled ids spell: mostly English, with the multi-byte characters a model's
# output has now and then (the tiny tokenizer splits each into its bytes).
TEXT = ("The capital of France is Paris, and the city is known for its museums, its cafés "
        "and the river that runs through it. In the morning the streets are quiet; by noon "
        "the terraces fill with people reading, talking and watching the boats go by. A "
        "naïve visitor might think it is always like this 😀, but in winter the rain comes "
        "in from the west and the city turns grey. 東京 is another story altogether: the "
        "trains run on time, the signs are clear, and the food is some of the best there "
        "is. ")


class InstantRunner:
    """The runner surface the engine drives with a device sampler, answering at once."""

    chain_rows = 512
    mixed_feed_rows = 1  # mixed steps pipeline too, as on the CuPy runner
    pipeline = True

    def __init__(self, num_pages: int, vocab: int, max_context: int, text_ids: list[int]
                 ) -> None:
        self.num_pages = num_pages
        self.config = SimpleNamespace(vocab_size=vocab, max_context=max_context)
        self.sampler = object()  # not None: the engine takes the device-sampling path
        self.backend = SimpleNamespace(arithmetic="instant")
        self._vocab = vocab
        self._text = np.asarray(text_ids, np.int64)

    def graph_stats(self) -> dict[str, int]:
        return dict.fromkeys(GRAPH_STATS, 0)

    def first_use(self, batch: Any, fed: bool) -> bool:
        return False  # no graphs: nothing is ever captured

    def launch_sample(self, batch: Any, rows: Any, host_rows: Any = (), feed: Any = None
                      ) -> _Done:
        # Each request reads TEXT from its own offset (its first page, distinct per
        # request) at its position: whole arrays, so the runner adds little of its own.
        final = batch.final_rows
        seg = np.searchsorted(batch.segments[:, 0], final, side="right") - 1
        at = batch.positions[final].astype(np.int64) + 37 * batch.page_tables[seg, 0]
        ids = self._text[at % self._text.size].tolist()[: len(rows)]
        host = np.zeros((len(host_rows), self._vocab), np.float32)
        return _Done(SampleOutput(tuple(ids), (None,) * len(ids)), host)


MODES = ("ids", "deltas", "text", "arrivals")


def arrivals_ms(running: int, steps: int, seed: int,
                profile: cProfile.Profile | None = None) -> float:
    """Serving's shape: ``running`` requests (prompts 30-800 tokens, 64-255 out, sampled at
    temperature 0.7), each that ends replaced by a new one, id deltas every step (the
    engine process): pipelined mixed steps beside the decode chain."""
    tok = tiny_tokenizer()
    runner = InstantRunner(running * 80 + 16, TINY_VOCAB_SIZE, 4096, tok.encode(TEXT))
    eng = LLMEngine(runner, tok, SchedulerConfig(token_budget=1024, max_queue=4 * running,
                                                 max_running=running), seed=seed)
    eng.detokenize = False
    rng = np.random.default_rng(seed)

    def add() -> None:
        eng.add_request(rng.integers(8, TINY_VOCAB_SIZE, int(rng.integers(30, 801))).tolist(),
                        SamplingParams(temperature=0.7, max_tokens=int(rng.integers(64, 256)),
                                       ignore_eos=True))

    def step() -> None:
        for d in eng.step():
            if d.finished:
                add()

    for _ in range(running):
        add()
    for _ in range(40):  # every prompt of the first wave in, ends and arrivals under way
        step()
    if profile is not None:
        profile.enable()
    t = time.process_time()
    for _ in range(steps):
        step()
    ms = (time.process_time() - t) / steps * 1e3
    if profile is not None:
        profile.disable()
    return ms


def round_ms(running: int, steps: int, mode: str, seed: int,
             profile: cProfile.Profile | None = None) -> float:
    if mode == "arrivals":
        return arrivals_ms(running, steps, seed, profile)
    tok = tiny_tokenizer()
    runner = InstantRunner(running * 40 + 16, TINY_VOCAB_SIZE, 4096, tok.encode(TEXT))
    eng = LLMEngine(runner, tok, SchedulerConfig(token_budget=4096, max_queue=running,
                                                 max_running=running), seed=seed)
    eng.detokenize = mode == "text"
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 64, ignore_eos=True)
    for _ in range(running):
        eng.add_request(rng.integers(8, TINY_VOCAB_SIZE, int(rng.integers(16, 96))).tolist(),
                        params, final_only=mode == "ids")
    # Every prompt in (4,096 prompt rows a step), decode under way, the pipeline primed.
    for _ in range(3 + -(-running * 96 // 4096)):
        eng.step()
    assert len(eng.scheduler.running) == running and not eng.scheduler.waiting
    if profile is not None:
        profile.enable()
    # CPU time of this process, not the wall clock: the engine runs on one thread here, and
    # other work on a shared machine would otherwise count as the engine's.
    t = time.process_time()
    for _ in range(steps):
        eng.step()
    ms = (time.process_time() - t) / steps * 1e3
    if profile is not None:
        profile.disable()
    return ms


def one_round(tree: Path, running: int, args: argparse.Namespace, seed: int
              ) -> dict[str, float]:
    """One round of every mode in a fresh process importing crucible from ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, __file__, "--running", str(running), "--steps",
               str(args.steps), "--rounds", "1", "--seed", str(seed), "--json", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(tree)))
        res = json.loads(out.read_text())["host_ms_per_step"][str(running)]
    return {k: v["median"] for k, v in res.items()}


def against(args: argparse.Namespace) -> dict:
    repo = Path(__file__).resolve().parent.parent
    base = Path(tempfile.mkdtemp(prefix="host-step-base-"))
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(base),
                    args.against], check=True)
    # side -> running -> mode -> per-round ms
    sides: dict[str, dict[int, dict[str, list[float]]]] = {"base": {}, "this": {}}
    try:
        for r in range(args.rounds):
            for n in args.running:
                order = [("base", base), ("this", repo)]
                for side, tree in order if r % 2 == 0 else order[::-1]:
                    for k, v in one_round(tree, n, args, r).items():
                        sides[side].setdefault(n, {}).setdefault(k, []).append(v)
                print(f"round {r}, {n} running: " + ", ".join(
                    f"{s} {m} {v[-1]:.3f}" for s in sides for m, v in sides[s][n].items()),
                    file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(base)])
    this, was = sides["this"], sides["base"]
    return {"against": args.against,
            "host_ms_per_step": {s: {str(n): {m: stat(v) for m, v in d.items()}
                                     for n, d in by_n.items()} for s, by_n in sides.items()},
            "base_over_this": {str(n): {m: stat([a / b for a, b in zip(was[n][m], v)])
                                        for m, v in d.items() if m in was[n]}
                               for n, d in this.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--running", type=lambda v: [int(x) for x in v.split(",")],
                   default=[256], help="running requests, comma-separated (default 256)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default="bench/host-step-cpu.json")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--against", default=None, metavar="REV")
    p.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)  # one_round's
    args = p.parse_args(argv)
    command = "python3 bench/host_step.py " + " ".join(argv if argv is not None
                                                       else sys.argv[1:])
    head = {"command": command, "running": args.running, "steps": args.steps,
            "rounds": args.rounds, "modes": list(MODES)}
    if args.against:
        write_json(args.json, {**head, **against(args)})
        return 0
    res: dict[int, dict[str, list[float]]] = {n: {m: [] for m in MODES} for n in args.running}
    for r in range(args.rounds):
        seed = r if args.seed is None else args.seed
        for n in args.running:
            k = seed % len(MODES)  # each mode takes its turn first
            for mode in MODES[k:] + MODES[:k]:
                res[n][mode].append(round_ms(n, args.steps, mode, seed))
            print(f"round {r}, {n} running: " + ", ".join(
                f"{m} {v[-1]:.3f} ms" for m, v in res[n].items()), file=sys.stderr, flush=True)
    if args.profile:
        for mode in MODES:
            prof = cProfile.Profile()
            round_ms(args.running[-1], args.steps, mode, 0, prof)
            print(f"== profile: {mode}, {args.running[-1]} running", file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(18)
    write_json(args.json, {**head, "host_ms_per_step": {
        str(n): {m: stat(v) for m, v in d.items()} for n, d in res.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
