"""Host time per engine step with instant kernels: what the engine's Python costs a step
when the device answers at once (issue: <= 1 ms at 256 running requests).

    python3 bench/host_step.py [--running 256] [--steps 200] [--rounds 5] [--json PATH]
                               [--profile]

An ``InstantRunner`` stands in for the GPU runner: it has a device sampler and pipelines
decode steps (``chain_rows`` 512) like the CuPy runner, and ``launch_sample`` answers at
once with ids drawn from the batch's own tokens (no forward). ``--running`` requests of
the tiny model's tokenizer (prompts 16-95 tokens, ``ignore_eos``, long outputs) are all
admitted first; then ``--steps`` steps are timed, each a decode step of every running
request. Two modes, alternating over rounds: ``ids`` (deltas of token ids only, as
``LLM.generate`` with ``final_only`` and the server's engine process see them) and
``text`` (every delta detokenised, the in-process streaming path). Figures: host ms per
step (the process's CPU time, so other load on the machine does not count), min and median
over rounds. ``--profile`` prints the top of a cProfile of one round.

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


class InstantRunner:
    """The runner surface the engine drives with a device sampler, answering at once."""

    chain_rows = 512
    pipeline = True

    def __init__(self, num_pages: int, vocab: int, max_context: int) -> None:
        self.num_pages = num_pages
        self.config = SimpleNamespace(vocab_size=vocab, max_context=max_context)
        self.sampler = object()  # not None: the engine takes the device-sampling path
        self.backend = SimpleNamespace(arithmetic="instant")
        self._vocab = vocab

    def launch_sample(self, batch: Any, rows: Any, host_rows: Any = (), feed: Any = None
                      ) -> _Done:
        ids = (batch.token_ids[batch.final_rows].astype(np.int64) * 31 + 7) % (self._vocab - 8)
        ids = (ids + 8).tolist()[: len(rows)]  # ids 0-7 hold the tiny tokenizer's specials
        host = np.zeros((len(host_rows), self._vocab), np.float32)
        return _Done(SampleOutput(tuple(ids), (None,) * len(ids)), host)


def round_ms(running: int, steps: int, text: bool, seed: int,
             profile: cProfile.Profile | None = None) -> float:
    tok = tiny_tokenizer()
    runner = InstantRunner(running * 40 + 16, TINY_VOCAB_SIZE, 4096)
    eng = LLMEngine(runner, tok, SchedulerConfig(token_budget=4096, max_queue=running,
                                                 max_running=running), seed=seed)
    eng.detokenize = text
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 64, ignore_eos=True)
    for _ in range(running):
        eng.add_request(rng.integers(8, TINY_VOCAB_SIZE, int(rng.integers(16, 96))).tolist(),
                        params, final_only=not text)
    for _ in range(4):  # every prompt in, decode under way, the pipeline primed
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


def one_round(tree: Path, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One round in a fresh process importing crucible from ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, __file__, "--running", str(args.running), "--steps",
               str(args.steps), "--rounds", "1", "--seed", str(seed), "--json", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(tree)))
        res = json.loads(out.read_text())["host_ms_per_step"]
    return {k: v["median"] for k, v in res.items()}


def against(args: argparse.Namespace) -> dict:
    repo = Path(__file__).resolve().parent.parent
    base = Path(tempfile.mkdtemp(prefix="host-step-base-"))
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(base),
                    args.against], check=True)
    sides: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    try:
        for r in range(args.rounds):
            order = [("base", base), ("this", repo)]
            for side, tree in order if r % 2 == 0 else order[::-1]:
                for k, v in one_round(tree, args, r).items():
                    sides[side].setdefault(k, []).append(v)
            print(f"round {r}: " + ", ".join(f"{s} {m} {sides[s][m][-1]:.3f}" for s in sides
                                             for m in sides[s]), file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(base)])
    return {"against": args.against,
            "host_ms_per_step": {s: {m: stat(v) for m, v in d.items()} for s, d in sides.items()},
            "base_over_this": {m: stat([a / b for a, b in zip(sides["base"][m], sides["this"][m])])
                               for m in sides["this"]}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default="bench/host-step-cpu.json")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--against", default=None, metavar="REV")
    p.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)  # one_round's
    args = p.parse_args(argv)
    command = "python3 bench/host_step.py " + " ".join(argv if argv is not None
                                                       else sys.argv[1:])
    if args.against:
        write_json(args.json, {"command": command, "running": args.running,
                               "steps": args.steps, **against(args)})
        return 0
    res: dict[str, list[float]] = {"ids": [], "text": []}
    for r in range(args.rounds):
        seed = r if args.seed is None else args.seed
        for mode in ("ids", "text") if r % 2 == 0 else ("text", "ids"):
            res[mode].append(round_ms(args.running, args.steps, mode == "text", seed))
        print(f"round {r}: ids {res['ids'][-1]:.3f} ms, text {res['text'][-1]:.3f} ms",
              file=sys.stderr, flush=True)
    if args.profile:
        for mode in ("ids", "text"):
            prof = cProfile.Profile()
            round_ms(args.running, args.steps, mode == "text", 0, prof)
            print(f"== profile: {mode}", file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(18)
    write_json(args.json, {
        "command": command, "running": args.running, "steps": args.steps,
        "host_ms_per_step": {k: stat(v) for k, v in res.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
