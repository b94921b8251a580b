"""Where a cached chat turn's time to first token goes: the engine's steps around one
turn's burst of arrivals (bench/prefix_cache_bench.py's chat workload, cache on).

    python3 bench/chat_timeline.py --model /tmp/smollm2.gguf --device cuda [--turns 4]

Runs the chat workload (``--users`` closed loops, the shared system prompt) once after a
warm-up, with ``LLMEngine.step``, ``_launch`` and ``add_request`` wrapped to log host
times, then prints the last turn: its TTFT spread, how long its arrivals took to reach
the engine, and every step from the first arrival to the last first token (the step's
host span, rows, prefill rows, requests waiting and running when it was planned), with
the calls inside it that took 50 us or more (``SPANS``: scheduling, batch building and
validation, planning ahead, launching, the pacer's wait, collecting, the prefix cache's
lookups and publishing, the async engine's hand-over of deltas and its wait for the loop's
answers) and every garbage-collector pass; runs of arrivals on the event loop
(``AsyncLLMEngine.add``, "arrive") and of the worker taking them in (``add_request``,
"add") as one line each.
A diagnostic: nothing here is a target figure. ``--json`` keeps the log.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prefix_cache_bench as pb  # noqa: E402
from prefix_chat import add_chat_args  # noqa: E402

import crucible.engine.engine as engine_mod  # noqa: E402
from crucible.engine.async_engine import AsyncLLMEngine  # noqa: E402
from crucible.engine.engine import LLMEngine  # noqa: E402
from crucible.engine.pacing import Pacer  # noqa: E402
from crucible.engine.prefix_cache import PrefixCache  # noqa: E402
from crucible.engine.runner import ModelRunner  # noqa: E402
from crucible.engine.scheduler import Scheduler  # noqa: E402
from crucible.engine.sampling import SamplingParams  # noqa: E402

LOG: list[dict[str, Any]] = []
T0 = [time.perf_counter()]


def now() -> float:
    return (time.perf_counter() - T0[0]) * 1e3


def instrument() -> Callable[[], None]:
    """Wrap the engine's methods (on the class); returns the undo."""
    step, launch, add = LLMEngine.step, LLMEngine._launch, LLMEngine.add_request

    def w_step(self: LLMEngine) -> Any:
        t = now()
        waiting, running = len(self.scheduler.waiting), len(self.scheduler.running)
        out = step(self)
        LOG.append({"ev": "step", "t0": t, "t1": now(), "waiting": waiting,
                    "running": running, "deltas": len(out)})
        return out

    def w_launch(self: LLMEngine, slices: Any, batch: Any, *a: Any, **k: Any) -> Any:
        t = now()
        out = launch(self, slices, batch, *a, **k)
        LOG.append({"ev": "launch", "t0": t, "t1": now(), "rows": int(batch.num_rows),
                    "prefill_rows": sum(s.length for s in slices if s.length > 1),
                    "slices": len(slices)})
        return out

    def w_add(self: LLMEngine, *a: Any, **k: Any) -> Any:
        t = now()
        out = add(self, *a, **k)
        LOG.append({"ev": "add", "t0": t, "t1": now()})
        return out

    def w_arrive(self: AsyncLLMEngine, *a: Any, **k: Any) -> Any:
        t = now()
        out = arrive(self, *a, **k)
        LOG.append({"ev": "arrive", "t0": t, "t1": now()})
        return out

    arrive = AsyncLLMEngine.add
    LLMEngine.step, LLMEngine._launch, LLMEngine.add_request = w_step, w_launch, w_add
    AsyncLLMEngine.add = w_arrive
    undos = [span(owner, name) for owner, name in SPANS]
    gc.callbacks.append(gc_log)

    def undo() -> None:
        LLMEngine.step, LLMEngine._launch, LLMEngine.add_request = step, launch, add
        AsyncLLMEngine.add = arrive
        for u in undos:
            u()
        gc.callbacks.remove(gc_log)

    return undo


# What a step's host time is made of: each call logged as a span inside the step's.
SPANS: list[tuple[Any, str]] = [(Scheduler, "schedule"), (engine_mod, "build_packed_batch"),
                                (engine_mod, "validate_packed_batch"), (engine_mod, "plan_next"),
                                (ModelRunner, "first_use"), (ModelRunner, "launch_sample"),
                                (Pacer, "wait"), (LLMEngine, "_collect"),
                                (PrefixCache, "match"), (PrefixCache, "publish_run"),
                                (AsyncLLMEngine, "_push_all"),
                                (AsyncLLMEngine, "_await_replies")]


def span(owner: Any, name: str) -> Callable[[], None]:
    """Log every call of ``owner.name`` as a span; returns the undo."""
    orig = getattr(owner, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        t = now()
        try:
            return orig(*a, **k)
        finally:
            LOG.append({"ev": "span", "name": name, "t0": t, "t1": now()})

    setattr(owner, name, wrapped)
    return lambda: setattr(owner, name, orig)


_GC_START = [0.0]


def gc_log(phase: str, info: dict[str, int]) -> None:
    """The garbage collector's passes, as spans (a full one stops the engine's thread)."""
    if phase == "start":
        _GC_START[0] = now()
    else:
        LOG.append({"ev": "span", "name": f"gc{info['generation']}", "t0": _GC_START[0],
                    "t1": now()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=pb.TINY)
    ap.add_argument("--device", default="cpu")
    add_chat_args(ap)
    ap.set_defaults(turns=4)
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    args = argparse.Namespace(weights=None, tiny_context=4096, num_pages=None,
                              max_running=None, seed=0, **vars(a))
    model = pb.load(args)
    ids = list(range(3, model.config.vocab_size - 2))
    undo = instrument()
    params = SamplingParams(max_tokens=a.reply_tokens, temperature=0, ignore_eos=True)
    try:
        llm = pb.fresh_llm(model, args, pb.CONFIGS["on"])
        asyncio.run(pb.chat_run(llm, *pb.conversations(args, ids, 7, 2), params))  # warm-up
        LOG.clear()
        T0[0] = time.perf_counter()
        _, recs = asyncio.run(pb.chat_run(llm, *pb.conversations(args, ids, 0, a.turns),
                                          params))
    finally:
        undo()
    last = [r for r in recs if r["turn"] == a.turns - 1]
    ttft = sorted(r["ttft_s"] * 1e3 for r in last)
    adds = [e for e in LOG if e["ev"] == "add"][-a.users:]
    start = adds[0]["t0"]
    print(f"turn {a.turns - 1}: ttft p50 {ttft[len(ttft) // 2]:.1f} ms, min {ttft[0]:.1f}, "
          f"max {ttft[-1]:.1f}; its {a.users} arrivals over {adds[-1]['t0'] - start:.1f} ms, "
          f"add_request {sum(e['t1'] - e['t0'] for e in adds) / len(adds) * 1e3:.0f} us each")
    end = start + ttft[-1] + 5
    run: list[dict[str, Any]] = []  # consecutive arrivals on the loop, or intakes, as one line
    for e in sorted(LOG, key=lambda e: e["t0"]) + [{"ev": "end", "t0": end, "t1": end}]:
        if not (start - 5 <= e["t1"] and e["t0"] <= end):
            continue
        if run and e["ev"] != run[0]["ev"]:
            what = "arrive (loop)" if run[0]["ev"] == "arrive" else "add (worker)"
            print(f"  {what:15s} {run[0]['t0'] - start:8.2f} .. {run[-1]['t1'] - start:8.2f} "
                  f"ms  {len(run)}")
            run = []
        if e["ev"] in ("arrive", "add"):
            run.append(e)
        elif e["ev"] == "span":
            if e["t1"] - e["t0"] >= 0.05 or e["name"].startswith("gc"):
                print(f"    {e['name']:22s} {e['t0'] - start:8.2f} +{e['t1'] - e['t0']:.2f} ms")
        elif e["ev"] == "launch":
            print(f"  launch {e['t0'] - start:8.2f} +{e['t1'] - e['t0']:.2f} ms  rows "
                  f"{e['rows']:5d}  prefill {e['prefill_rows']:5d}  slices {e['slices']}")
        elif e["ev"] == "step":
            print(f"step   {e['t0'] - start:8.2f} .. {e['t1'] - start:8.2f} ms  waiting "
                  f"{e['waiting']:3d} running {e['running']:3d} deltas {e['deltas']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"command": "python3 bench/chat_timeline.py "
                                            + " ".join(argv or sys.argv[1:]),
                                            "ttft_ms_last_turn": ttft, "log": LOG}, indent=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
