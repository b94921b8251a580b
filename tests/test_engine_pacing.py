"""Late planning (engine/pacing.py) in simulated time: a runner whose steps take fixed
device time on a simulated clock (each queued behind the one before, like a CUDA stream),
driven by a serving loop that takes arrivals between steps and, with a pacer, inside them.

- A request arriving while a step runs gets its first token one step sooner with the
  pacer than without (the pipeline otherwise admits it into the step after next).
- The device never idles in a steady stream of steps, and when a step ends sooner than
  expected it idles at most one poll.
- Where an arrival could not join (requests already waiting), the pacer never waits.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from crucible.backend.protocol import GRAPH_STATS
from crucible.engine.engine import LLMEngine
from crucible.engine.pacing import Pacer
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer
from crucible.step.rows import SampleOutput

STEP_S = 0.010


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.now += dt


class SimPending:
    def __init__(self, clock: Clock, end: float, out: SampleOutput, host: np.ndarray) -> None:
        self.clock, self.end, self.value = clock, end, (out, host)

    def done(self) -> bool:
        return self.clock.now >= self.end

    def result(self) -> tuple[SampleOutput, np.ndarray]:
        self.clock.now = max(self.clock.now, self.end)  # the host blocks until the ids land
        return self.value


class SimRunner:
    """The runner surface with a device sampler; each step takes ``length()`` seconds of
    device time, starting when the previous one ends or when it is launched."""

    chain_rows = 512
    mixed_feed_rows = 1
    pipeline = True

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.num_pages = 4096
        self.config = SimpleNamespace(vocab_size=TINY_VOCAB_SIZE, max_context=4096)
        self.sampler = object()
        self.backend = SimpleNamespace(arithmetic="sim")
        self.busy_until = 0.0
        self.idle = [0.0]  # device idle time before each launch (after the first)
        self.length = lambda: STEP_S

    def graph_stats(self) -> dict[str, int]:
        return dict.fromkeys(GRAPH_STATS, 0)

    def first_use(self, batch: Any, fed: bool) -> bool:
        return False

    def launch_sample(self, batch: Any, rows: Any, host_rows: Any = (), feed: Any = None
                      ) -> SimPending:
        start = max(self.clock.now, self.busy_until)
        if self.busy_until:
            self.idle.append(start - self.busy_until)
        self.busy_until = start + self.length()
        ids = [int(p) % 200 + 8 for p in batch.positions[batch.final_rows][: len(rows)]]
        out = SampleOutput(tuple(ids), (None,) * len(ids))
        return SimPending(self.clock, self.busy_until,
                          out, np.zeros((len(host_rows), TINY_VOCAB_SIZE), np.float32))


def serve(pacer_on: bool, arrive_at: float, steps: int = 40, running: int = 16,
          waiting: int = 0) -> tuple[float | None, SimRunner, Pacer | None]:
    """A serving loop: ``running`` long requests, one more arriving at ``arrive_at``
    (simulated seconds); returns its time to first token, the runner, the pacer."""
    clock = Clock()
    runner = SimRunner(clock)
    eng = LLMEngine(runner, tiny_tokenizer(), SchedulerConfig(
        token_budget=1024, max_queue=512, max_running=running + (0 if waiting else 8)), seed=0)
    eng.detokenize = False
    long = SamplingParams(temperature=0.7, max_tokens=10_000, ignore_eos=True)
    for i in range(running + waiting):
        eng.add_request(list(range(8, 8 + 20 + i)), long)
    late: dict[str, Any] = {"rid": None, "ttft": None}

    def arrivals() -> None:
        if late["rid"] is None and clock.now >= arrive_at:
            late["rid"] = eng.add_request(list(range(30, 70)), long)
            late["t"] = clock.now

    pacer = Pacer(arrivals, clock=clock, sleep=clock.sleep) if pacer_on else None
    eng.pacer = pacer
    for _ in range(steps):
        arrivals()
        for d in eng.step():
            if d.request_id == late["rid"] and d.new_token_ids and late["ttft"] is None:
                late["ttft"] = clock.now - arrive_at
    return late["ttft"], runner, pacer


def test_an_arrival_mid_step_gets_its_first_token_a_step_sooner() -> None:
    at = 20 * STEP_S + 0.3 * STEP_S  # well into a step, once the lengths are known
    plain, _, _ = serve(False, at)
    paced, _, pacer = serve(True, at)
    assert plain is not None and paced is not None
    assert paced <= plain - 0.8 * STEP_S, (plain, paced)
    assert pacer.num_waits > 0


def test_the_device_never_idles_in_steady_steps() -> None:
    _, runner, pacer = serve(True, 1e9, steps=60)
    assert sum(runner.idle) == 0.0 and pacer.num_waits > 30


def test_a_step_shorter_than_expected_idles_the_device_one_poll_at_most() -> None:
    clock = Clock()
    runner = SimRunner(clock)
    lengths = iter([STEP_S] * 30 + [0.3 * STEP_S] + [STEP_S] * 30)
    runner.length = lambda: next(lengths, STEP_S)
    eng = LLMEngine(runner, tiny_tokenizer(), SchedulerConfig(
        token_budget=1024, max_queue=64, max_running=16), seed=0)
    eng.detokenize = False
    for i in range(8):
        eng.add_request(list(range(8, 30 + i)),
                        SamplingParams(max_tokens=10_000, ignore_eos=True))
    eng.pacer = Pacer(lambda: None, clock=clock, sleep=clock.sleep)
    for _ in range(60):
        eng.step()
    assert 0.0 < max(runner.idle) <= eng.pacer.poll_s + 1e-12


def test_no_wait_where_an_arrival_could_not_join() -> None:
    _, _, pacer = serve(True, 1e9, steps=30, running=4, waiting=8)
    assert pacer.num_waits == 0


def test_engine_core_takes_arrivals_in_during_a_step_and_sends_them_in_its_frame() -> None:
    """The engine process's loop (core_process.EngineCore) with a pacer: an add that lands
    on the pipe while a step runs is applied inside engine.step() (the pacer's drain), and
    the step's frame reports it (its delta arrives like any other's)."""
    from multiprocessing import Pipe

    from crucible.engine import core_wire as wire
    from crucible.engine.core_loop import EngineCore

    clock = Clock()
    runner = SimRunner(clock)
    eng = LLMEngine(runner, tiny_tokenizer(), SchedulerConfig(
        token_budget=1024, max_queue=64, max_running=32), seed=0)
    eng.detokenize = False
    eng.pacer = Pacer(lambda: None, clock=clock, sleep=clock.sleep)
    front, back = Pipe()
    core = EngineCore(eng, back)
    assert eng.pacer.arrivals == core._arrivals
    long = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for h in range(8):
        front.send_bytes(wire.encode_add(h, f"r{h}", list(range(8, 30 + h)), long))
    sent = {"late": False, "in_step": False}
    drain, inside = core._drain, {"now": False}

    def drain_and_add(ended: list, block: bool) -> bool:  # the late add, mid-step
        if not sent["late"] and clock.now > 15 * STEP_S and inside["now"]:
            front.send_bytes(wire.encode_add(99, "late", list(range(40, 60)), long))
            sent["late"] = True
        return drain(ended, block)

    core._drain = drain_and_add
    steps = {"n": 0}
    step = eng.step

    def counted() -> list:
        steps["n"] += 1
        if steps["n"] > 40:
            core.stopping = True
        inside["now"] = True
        try:
            return step()
        finally:
            inside["now"] = False

    eng.step = counted
    core._loop(None)
    assert sent["late"]  # sent, and taken in, by the pacer's drain inside a step
    assert len(eng.requests["late"].output_token_ids) > 10
    frames = 0
    while front.poll(0):
        front.recv_bytes()
        frames += 1
    assert frames >= 40  # one per step
