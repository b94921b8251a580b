"""AsyncLLMEngine's hand-over: after a step with a first token or a finish, the worker lets
the event loop take them in before it plans the next step (crucible/engine/handoff.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

import crucible.engine.async_engine as async_engine
from crucible import LLM, SamplingParams
from crucible.engine import handoff
from crucible.engine.handoff import hand_over
from crucible.model.tiny import tiny_random_model


@pytest.fixture(scope="module")
def llm():
    return LLM(tiny_random_model(0, weights="f32", tie_embeddings=False), weights="f32",
               token_budget=64)


def test_hand_over_returns_after_the_woken_tasks_ran():
    async def main():
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        seen: list[int] = []

        async def consumer():
            while (item := await queue.get()) != 3:
                seen.append(item)  # what a woken task does before its next await

        task = asyncio.create_task(consumer())
        await asyncio.sleep(0)  # the consumer now waits on the queue

        def worker():
            out = []
            for i in (1, 2, 3):
                loop.call_soon_threadsafe(queue.put_nowait, i)
                out.append((hand_over([loop], cap_s=5.0), list(seen)))
            return out

        res = await asyncio.to_thread(worker)
        await task
        assert res == [(True, [1]), (True, [1, 2]), (True, [1, 2])]

    asyncio.run(main())


def test_hand_over_gives_up_at_its_cap_and_skips_closed_loops():
    async def main():
        loop = asyncio.get_running_loop()

        def worker():
            loop.call_soon_threadsafe(time.sleep, 0.5)  # the loop is stuck in a callback
            t0 = time.perf_counter()
            ok = hand_over([loop], cap_s=0.02)
            return ok, time.perf_counter() - t0

        ok, waited = await asyncio.to_thread(worker)
        assert not ok and waited < 0.4

    asyncio.run(main())
    closed = asyncio.new_event_loop()
    closed.close()
    t0 = time.perf_counter()
    assert hand_over([closed], cap_s=5.0) and time.perf_counter() - t0 < 1.0


def test_only_first_tokens_and_finishes_hand_over(llm, monkeypatch):
    calls: list[int] = []

    def spy(loops, cap_s=None):
        calls.append(len(loops))
        return hand_over(loops, cap_s)

    monkeypatch.setattr(async_engine, "hand_over", spy)
    ae = llm.async_engine()
    prompt = llm.tokenizer.encode("the quick brown fox")

    async def main():
        deltas = [d async for d in ae.generate(prompt, SamplingParams(
            temperature=0, max_tokens=6, ignore_eos=True))]
        # an abort before the first token leaves no trace in the quiet set
        it = ae.generate(prompt, SamplingParams(max_tokens=50, ignore_eos=True))
        await it.aclose()
        await ae.shutdown()
        return deltas

    deltas = asyncio.run(main())
    with_tokens = [d for d in deltas if d.new_token_ids]
    assert sum(len(d.new_token_ids) for d in deltas) == 6 and len(with_tokens) >= 3
    assert deltas[-1].finished
    # the first token's step and the last one: the plain steps between do not wait
    assert calls == [1, 1]
    assert ae._quiet == set() and ae._streams == {}
    s = llm.stats()
    assert s["pages_free"] == s["pages_total"]


def test_a_closed_loop_callers_next_request_makes_the_next_step(llm, monkeypatch):
    """A reply's end reaches its caller, whose next request is admitted before the worker
    steps again (with a cap long enough that a loaded machine cannot make it flaky)."""
    monkeypatch.setattr(handoff, "CAP_S", 5.0)
    eng = llm.engine
    steps = [0]
    finished_at: dict[str, int] = {}
    added_at: dict[str, int] = {}
    step, add = eng.step, eng.add_request

    def counted_step():
        out = step()
        steps[0] += 1
        for d in out:
            if d.finished:
                finished_at[d.request_id] = steps[0]
        return out

    def counted_add(prompt, params=None, request_id=None, **kw):
        added_at[request_id] = steps[0]
        return add(prompt, params, request_id=request_id, **kw)

    monkeypatch.setattr(eng, "step", counted_step)
    monkeypatch.setattr(eng, "add_request", counted_add)
    ae = llm.async_engine()
    prompt = llm.tokenizer.encode("jumps over the lazy dog")
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    async def main():
        # Another request keeps the engine stepping: without the hand-over the worker
        # would go straight on to the next step, not idle until the next turn arrives.
        background = ae.generate(prompt, SamplingParams(max_tokens=400, ignore_eos=True))
        await background.__anext__()
        ids = []
        for turn in range(8):
            async for d in ae.generate(prompt + [turn + 1], params, request_id=f"turn{turn}"):
                pass
            ids.append(d.request_id)
        assert eng.has_unfinished()  # the background request was running all along
        await background.aclose()
        await ae.shutdown()
        return ids

    ids = asyncio.run(main())
    for prev, nxt in zip(ids, ids[1:]):
        assert added_at[nxt] == finished_at[prev], (added_at, finished_at)
