"""The throughput bench's measurement (bench/throughput.py): timing wrappers on the engine,
graph counters, one timed generate and the per-step stats.

Measurement (public API only; nothing in the library changes): each of ``--rounds`` rounds
(and the untimed warm-up) is one ``timed_generate`` of the whole workload on the same LLM.
Per round: wall time, prompt/output tokens, total and output tok/s, req/s, engine steps
(``engine.num_steps``: forwards launched, pipelined ones included), mean rows per step
(``engine.num_rows / steps``), preemptions, pipelined (chained) steps and the mixed ones among them. A wrapper object
replaces, on the instance only, ``engine.step`` (per call: wall time, rows, launches and
the running requests: ``len(scheduler.running)`` after the call plus the requests that
finished in it) and ``runner.forward`` (host sampling, ``runner.sampler is None``) or
``runner.launch_sample`` (device sampling): host ms is the CPU-clock time inside that call
per launch; on the CPU that is the forward itself, on CUDA the launch (asynchronous).
``engine overhead ms`` is a step call's wall less its launches' host ms (scheduling, batch
build, validation, host sampling, updates). On CUDA, when cupy imports, a CUDA event is
recorded on the current stream at the start and end of each step call; GPU ms is the time
between them on the device (it includes device idle while the host prepares, and with
pipelining a call's span includes the decode step it queued ahead). Graph counters (CuPy
backend): decode, prefill and mixed graph replays and captures; eager steps = steps - replays.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

from crucible import LLM, SamplingParams


def graph_counters(llm: LLM) -> dict[str, float]:
    """The CuPy backend's graph counters (empty elsewhere, or with graphs off), and the
    host seconds the mixed graphs' captures took (``mixed_capture_s``)."""
    be = llm.engine.runner.backend
    out: dict[str, int] = {}
    for prefix, attr, fields in (("decode", "graphs", ("num_replays", "num_captures")),
                                 ("prefill", "prefill_graphs",
                                  ("num_replays", "num_captures", "num_eager")),
                                 ("mixed", "mixed_graphs",
                                  ("num_replays", "num_captures", "num_eager"))):
        g = getattr(be, attr, None)
        if g is not None:
            for f in fields:
                out[f"{prefix}_{f[4:]}"] = int(getattr(g, f))
    if getattr(be, "mixed_graphs", None) is not None:
        out["mixed_capture_s"] = round(float(be.mixed_graphs.capture_s), 4)
    return out


class Probe:
    """Times engine.step calls and the runner's forward/launch by wrapping them on the
    instances (the classes are untouched); ``close`` puts the instances back."""

    def __init__(self, llm: LLM) -> None:
        self.engine = eng = llm.engine
        self.runner = runner = eng.runner
        self.call_name = "forward" if runner.sampler is None else "launch_sample"
        self._step: Callable[[], Any] = eng.step
        self._call: Callable[..., Any] = getattr(runner, self.call_name)
        self.cp = None
        if runner.device == "cuda":
            try:
                import cupy

                self.cp = cupy
            except ImportError:
                pass
        self.reset()
        eng.step = self.step  # type: ignore[method-assign]
        setattr(runner, self.call_name, self.call)

    def reset(self) -> None:
        self.samples: list[tuple[float, int, int, int]] = []  # wall, rows, launches, running
        self.call_ms: list[float] = []  # per launch
        self.overhead_ms: list[float] = []  # per step call that launched
        self.events: list[tuple[Any, Any]] = []
        self._in_step_ms = 0.0

    def call(self, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return self._call(*a, **k)
        finally:
            ms = (time.perf_counter() - t) * 1e3
            self.call_ms.append(ms)
            self._in_step_ms += ms

    def step(self) -> Any:
        eng = self.engine
        rows0, launches0 = eng.num_rows, eng.num_steps
        self._in_step_ms = 0.0
        ev0 = None
        if self.cp is not None:
            ev0 = self.cp.cuda.Event()
            ev0.record()
        t = time.perf_counter()
        deltas = self._step()
        wall = time.perf_counter() - t
        if ev0 is not None:
            ev1 = self.cp.cuda.Event()
            ev1.record()
            self.events.append((ev0, ev1))
        launches = eng.num_steps - launches0
        running = len(eng.scheduler.running) + sum(1 for d in deltas if d.finished)
        self.samples.append((wall, eng.num_rows - rows0, launches, running))
        if launches:
            self.overhead_ms.append(wall * 1e3 - self._in_step_ms)
        return deltas

    def gpu_ms(self) -> list[float]:
        if not self.events:
            return []
        self.events[-1][1].synchronize()
        return [self.cp.cuda.get_elapsed_time(a, b) for a, b in self.events]

    def close(self) -> None:
        del self.engine.step
        delattr(self.runner, self.call_name)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def dist(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"n": len(values), "mean": round(statistics.fmean(values), 4),
            "p50": round(pct(values, 0.5), 4), "p99": round(pct(values, 0.99), 4)}


def timed_generate(llm: LLM, probe: Probe, prompts: list[list[int]],
                   params: list[SamplingParams]) -> dict[str, Any]:
    eng = llm.engine
    probe.reset()
    s0 = dict(steps=eng.num_steps, rows=eng.num_rows, chained=eng.num_chained,
              mixed=eng.num_chained_mixed, pre=llm.stats()["preemptions"])
    g0 = graph_counters(llm)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t
    g1 = graph_counters(llm)
    steps, rows = eng.num_steps - s0["steps"], eng.num_rows - s0["rows"]
    n_prompt = sum(len(o.prompt_token_ids) for o in outs)
    n_out = sum(len(o.token_ids) for o in outs)
    step_ms = [s[0] * 1e3 for s in probe.samples if s[2]]
    graphs = {k: g1[k] - g0.get(k, 0) for k in g1}
    r: dict[str, Any] = {
        "wall_s": round(wall, 4), "requests": len(outs), "prompt_tokens": n_prompt,
        "output_tokens": n_out, "total_tok_per_s": round((n_prompt + n_out) / wall, 1),
        "output_tok_per_s": round(n_out / wall, 1), "req_per_s": round(len(outs) / wall, 3),
        "steps": steps, "step_calls": len(probe.samples), "rows": rows,
        "mean_rows_per_step": round(rows / steps, 2) if steps else None,
        "chained_steps": eng.num_chained - s0["chained"],
        "chained_mixed_steps": eng.num_chained_mixed - s0["mixed"],
        "preemptions": llm.stats()["preemptions"] - s0["pre"],
        "not_length_finish": sum(o.finish_reason != "length" for o in outs),
        "step_call_wall_ms": dist(step_ms),
        f"host_ms_in_{probe.call_name}": dist(probe.call_ms),
        "engine_overhead_ms": dist(probe.overhead_ms),
        "gpu_ms_per_step_call": dist(probe.gpu_ms()),
        "graphs": graphs,
    }
    if graphs:
        replays = sum(graphs.get(f"{k}_replays", 0) for k in ("decode", "prefill", "mixed"))
        r["graph_replays"] = replays
        r["eager_steps"] = steps - replays
        r["captures_in_timed_run"] = sum(graphs.get(f"{k}_captures", 0)
                                         for k in ("decode", "prefill", "mixed"))
    r["_samples"] = list(probe.samples)
    r["_outs"] = outs
    return r

