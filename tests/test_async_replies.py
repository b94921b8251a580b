"""A closed-loop client's next request joins the step planned right after its last one
finished (``AsyncLLMEngine._await_replies``).

A chat client answers a finished turn with its next one on its event loop. The pipelined
worker used to plan the next step as soon as it had handed the deltas over, holding the
GIL until it blocked on the device, so the answer reached the engine one step late (on an
H100 the cached chat TTFT p50 was 1.17x, bench/push-all-revert-chat-ab-h100.json). Here on
the CPU with ``FeedRunner``'s fake device made slow (``SlowRunner``: each step "runs" 50 ms,
so the device is busy while the loop answers; a long request keeps a step queued ahead):
every follow-up request is taken in before
the next launch, and with the wait taken out (the negative control) none is. The GIL's
switch interval is raised for the test, so neither outcome depends on when the interpreter
would force a switch.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from crucible.engine.async_engine import AsyncLLMEngine
from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from engine_fakes import fake_tokenizer
from test_engine_pipeline import EOS, VOCAB, FeedRunner

STEP_S = 0.05  # the fake device's time a step: ample for the loop to answer on a busy CI box
STALL_S = 0.005  # the event loop's blocking calls (``stall``)


class _SlowPending:
    """A step's result, ready STEP_S after its launch (or after the step before it)."""

    def __init__(self, result, ready_at: float) -> None:
        self._result, self.ready_at = result, ready_at

    def done(self) -> bool:
        return time.perf_counter() >= self.ready_at

    def result(self):
        time.sleep(max(0.0, self.ready_at - time.perf_counter()))  # releases the GIL
        return self._result._result


class SlowRunner(FeedRunner):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._free_at = 0.0  # when the fake device finishes what it has queued

    def launch_sample(self, batch, rows, host_rows=(), feed=None):
        out = super().launch_sample(batch, rows, host_rows, feed)
        self._free_at = max(self._free_at, time.perf_counter()) + STEP_S
        return _SlowPending(out, self._free_at)


def run_chat(users: int, turns: int) -> tuple[list[tuple], dict[str, str]]:
    """Closed loops of ``turns`` requests each; (the worker's event log, follow-up request
    id -> the request id it answered)."""
    runner = SlowRunner(256, vocab_size=VOCAB)
    eng = LLMEngine(runner, fake_tokenizer(EOS), SchedulerConfig(token_budget=256,
                                                                  max_running=16))
    aeng = AsyncLLMEngine(eng)
    log: list[tuple] = []  # appended on the worker thread only
    add, launch, push = eng.add_request, eng._launch, aeng._push_all

    def w_add(prompt, params, request_id=None, **kw):
        log.append(("add", request_id))
        return add(prompt, params, request_id=request_id, **kw)

    def w_launch(*a, **k):
        log.append(("launch",))
        return launch(*a, **k)

    def w_push(items):
        log.append(("finished", [rid for rid, _, last in items if last]))
        return push(items)

    eng.add_request, eng._launch, aeng._push_all = w_add, w_launch, w_push
    answers: dict[str, str] = {}
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

    async def user(u: int) -> None:
        history, prev = [5 + u, 7, 9], None
        for t in range(turns):
            rid = f"u{u}-t{t}"
            if prev is not None:
                answers[rid] = prev
            async for d in aeng.generate(history + [11 + t], params, request_id=rid):
                history += d.new_token_ids
            prev = rid

    async def keeper() -> None:  # a long request: a step is always queued ahead
        async for _ in aeng.generate([4, 4, 4], SamplingParams(max_tokens=400,
                                                               ignore_eos=True)):
            pass

    async def stall() -> None:
        # The loop is mostly inside a blocking call, as an application's loop may be: the
        # worker then never meets it at the GIL where it hands deltas over, and only a wait
        # for the loop's answers gets them in time.
        while True:
            time.sleep(STALL_S)
            await asyncio.sleep(0)

    async def main() -> None:
        keep, busy = asyncio.ensure_future(keeper()), asyncio.ensure_future(stall())
        try:
            await asyncio.sleep(2 * STEP_S)  # the keeper is decoding, pipelined
            await asyncio.gather(*(user(u) for u in range(users)))
        finally:
            keep.cancel()
            busy.cancel()
            await aeng.shutdown()

    asyncio.run(main())
    assert eng.allocator.num_free == 256
    return log, answers


def late_answers(log: list[tuple], answers: dict[str, str]) -> list[str]:
    """Follow-ups taken in after the launch that came next after their predecessor's end."""
    late = []
    for rid, prev in answers.items():
        end = next(i for i, e in enumerate(log) if e[0] == "finished" and prev in e[1])
        nxt = next(i for i, e in enumerate(log) if i > end and e[0] == "launch")
        if log.index(("add", rid)) > nxt:
            late.append(rid)
    return late


@pytest.fixture
def no_forced_switch():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # the worker gives the GIL up only where it blocks
    yield
    sys.setswitchinterval(old)


def test_follow_ups_join_the_next_step(no_forced_switch):
    log, answers = run_chat(users=3, turns=3)
    assert len(answers) == 6
    assert late_answers(log, answers) == []


def test_without_the_wait_follow_ups_are_late(no_forced_switch, monkeypatch):
    monkeypatch.setattr(AsyncLLMEngine, "_await_replies", lambda self, acks: None)
    log, answers = run_chat(users=3, turns=3)
    # All are late but for a loop that woke in the microseconds the worker spent in the
    # wake-up's system call (it then answers first): allow one such.
    assert len(late_answers(log, answers)) >= len(answers) - 1
