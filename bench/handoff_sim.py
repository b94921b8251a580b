"""The chat bench's TTFT with and without AsyncLLMEngine's hand-over, on a simulated device.

    python3 bench/handoff_sim.py [--rounds 3] [--json bench/handoff-sim-cpu.json]

Why a simulation: the hand-over (crucible/engine/handoff.py) is about who holds the GIL
between the engine's worker thread and the callers' event loop, and on the CPU backend the
forward itself is host work that fights for the same cores, which a GPU's is not.
Here host_step.py's instant runner stands in for the device with a clock of its own: a
step launched at t starts when the device is free and takes ``--base-ms`` plus
``--row-us`` a row (by default about an H200's: a 64-row decode step 2.0 ms, a chat
cohort's ~1,000-row step 10.6 ms); reading its ids sleeps until it ends, so the worker
releases the GIL there as it does in CuPy's synchronize. Everything else is the real
engine: scheduler, pipeline, prefix cache (index only: the instant runner computes nothing),
AsyncLLMEngine and bench/prefix_chat.py's users (``--users`` closed loops of ``--turns``
turns behind a ``--system-tokens`` prompt, tiny tokenizer ids). The instant runner's ids
depend on where a request's pages lie, so replies differ between configurations here;
exactness is the real benches' business.

Each round runs the four configurations in fresh engines (hand-over on/off x cache
on/off; ``--late``: each also with late planning), the order alternating by round; figures are TTFT p50/p99 and total tok/s,
median and min-max over rounds, with the cache's off/on TTFT ratio per hand-over mode.
A model of the device, not a measurement of one: the GPU A/B is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_step as hs  # noqa: E402
import prefix_chat as pc  # noqa: E402
from common import stat, write_json  # noqa: E402
from throughput_measure import pct  # noqa: E402

import crucible.engine.async_engine as async_engine  # noqa: E402
from crucible.engine.async_engine import AsyncLLMEngine  # noqa: E402
from crucible.engine.engine import LLMEngine  # noqa: E402
from crucible.engine.pacing import Pacer  # noqa: E402
from crucible.engine.prefix_cache import PrefixCache  # noqa: E402
from crucible.engine.sampling import SamplingParams  # noqa: E402
from crucible.engine.scheduler import SchedulerConfig  # noqa: E402
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer  # noqa: E402

REAL_HAND_OVER = async_engine.hand_over


class _Timed:
    def __init__(self, done: Any, end: float) -> None:
        self.inner, self.end = done, end

    def done(self) -> bool:
        return time.perf_counter() >= self.end

    def result(self) -> Any:
        wait = self.end - time.perf_counter()
        if wait > 0:
            time.sleep(wait)  # releases the GIL, as a device synchronize does
        return self.inner.result()


class TimedRunner(hs.InstantRunner):
    """The instant runner with a device clock: steps run one after another."""

    def __init__(self, *a: Any, base_ms: float, row_us: float) -> None:
        super().__init__(*a)
        self.base_s, self.row_s, self.free = base_ms / 1e3, row_us / 1e6, 0.0

    def launch_sample(self, batch: Any, rows: Any, host_rows: Any = (), feed: Any = None
                      ) -> _Timed:
        start = max(time.perf_counter(), self.free)
        self.free = start + self.base_s + self.row_s * len(batch.positions)
        return _Timed(super().launch_sample(batch, rows, host_rows, feed), self.free)


def one_run(args: argparse.Namespace, handoff: bool, cache: bool, seed: int,
            late: bool = False) -> dict[str, Any]:
    tok = tiny_tokenizer()
    pages = args.users * (args.system_tokens + args.turns * (args.user_max + args.reply_tokens)
                          ) // 16 + 64
    runner = TimedRunner(pages, TINY_VOCAB_SIZE, 8192, tok.encode(hs.TEXT),
                         base_ms=args.base_ms, row_us=args.row_us)
    prefix = PrefixCache(("sim", "tiny", "f32"), "instant", pages) if cache else None
    eng = LLMEngine(runner, tok, SchedulerConfig(token_budget=args.token_budget,
                                                 max_queue=4 * args.users,
                                                 max_running=args.users),
                    seed=seed, prefix_cache=prefix)
    eng.detokenize = False
    if late:  # CRUCIBLE_LATE_PLANNING=1's pacer (AsyncLLMEngine sets its arrivals)
        eng.pacer = Pacer(arrivals=lambda: None)
    ids = list(range(8, TINY_VOCAB_SIZE))
    system, msgs = pc.conversations(args, ids, seed, args.turns)
    params = SamplingParams(temperature=0, max_tokens=args.reply_tokens, ignore_eos=True)
    llm = SimpleNamespace(async_engine=lambda: AsyncLLMEngine(eng))
    async_engine.hand_over = REAL_HAND_OVER if handoff else (lambda loops, cap_s=None: True)
    try:
        wall, recs = asyncio.run(pc.chat_run(llm, system, msgs, params))
    finally:
        async_engine.hand_over = REAL_HAND_OVER
    ttft = [r["ttft_s"] * 1e3 for r in recs]
    n = sum(r["prompt_tokens"] + len(r["reply"]) for r in recs)
    return {"ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
            "total_tok_per_s": n / wall}


def name(handoff: bool, cache: bool | None, late: bool) -> str:
    return (f"handoff={handoff}" + ("" if cache is None else f" cache={cache}")
            + (" late" if late else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    pc.add_chat_args(ap)
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--base-ms", type=float, default=1.4)
    ap.add_argument("--row-us", type=float, default=9.0)
    ap.add_argument("--late", action="store_true",
                    help="also run every configuration with late planning (engine/pacing.py)")
    ap.add_argument("--json")
    args = ap.parse_args()
    configs = [(h, c, lt) for lt in ((False, True) if args.late else (False,))
               for h in (True, False) for c in (True, False)]
    runs: dict[str, list[dict[str, Any]]] = {name(*k): [] for k in configs}
    for r in range(args.rounds):
        for h, c, lt in (configs if r % 2 == 0 else configs[::-1]):
            out = one_run(args, h, c, seed=r, late=lt)
            runs[name(h, c, lt)].append(out)
            print(f"round {r} {name(h, c, lt)}: TTFT p50 {out['ttft_p50_ms']:.2f} ms, "
                  f"p99 {out['ttft_p99_ms']:.2f}, {out['total_tok_per_s']:,.0f} tok/s",
                  flush=True)
    summary = {k: {m: stat([x[m] for x in v]) for m in ("ttft_p50_ms", "ttft_p99_ms",
                                                         "total_tok_per_s")}
               for k, v in runs.items()}
    ratios = {name(h, None, lt): stat([off["ttft_p50_ms"] / on["ttft_p50_ms"] for on, off in
                                       zip(runs[name(h, True, lt)], runs[name(h, False, lt)])])
              for h, c, lt in configs if c}
    result = {"bench": "handoff_sim", "command": " ".join(sys.argv), "args": vars(args),
              "summary": summary, "ttft_p50_off_over_on": ratios}
    if args.json:
        write_json(args.json, result)
    for k, v in summary.items():
        print(f"{k}: TTFT p50 {v['ttft_p50_ms']['median']:.2f} ms, "
              f"{v['total_tok_per_s']['median']:,.0f} tok/s")
    print("TTFT p50 off/on:", {k: round(v["median"], 3) for k, v in ratios.items()})


if __name__ == "__main__":
    main()
