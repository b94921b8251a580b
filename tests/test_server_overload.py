"""Overload over real HTTP (tiny random model): a full waiting queue answers 429
(Anthropic: 529 overloaded_error) at once, with Retry-After; a burst of 24 against bounds 1-4
splits exactly into bound accepted + rest refused, and every page comes back; a refusal made
by the worker is still a 429, not a failure."""

from __future__ import annotations

import asyncio

import aiohttp
import anthropic
import openai
import pytest

from crucible.server.probe import wait_idle
from overload_server import (BURST_PROMPT, MODEL, metrics, open_blocker, start,
                             wait_for)
from overload_server import server  # noqa: F401


@pytest.mark.parametrize("bound", [1, 2, 3, 4])
def test_burst_of_24_against_queue_bound(bound):
    srv = start(max_queue=bound, num_pages=128, step_delay=0.02)
    try:
        async def run() -> list[tuple[int, dict, dict]]:
            async with aiohttp.ClientSession() as s:
                blocker = await open_blocker(s, srv)

                async def one() -> tuple[int, dict, dict]:
                    async with s.post(srv.url + "/generate", json={
                            "prompt_token_ids": BURST_PROMPT, "max_tokens": 4,
                            "ignore_eos": True}) as r:
                        return r.status, dict(r.headers), await r.json()

                tasks = [asyncio.create_task(one()) for _ in range(24)]
                # Every request is either answered (refused) or waiting in the queue.
                await wait_for(lambda: sum(t.done() for t in tasks)
                               + metrics(srv)["crucible_requests_waiting"] == 24)
                assert not blocker.content.at_eof(), "the blocker ended before the burst"
                blocker.close()  # disconnect: its pages free, the queued requests run
                return await asyncio.gather(*tasks)

        results = asyncio.run(run())
        ok = [r for r in results if r[0] == 200]
        refused = [r for r in results if r[0] == 429]
        assert (len(ok), len(refused)) == (bound, 24 - bound)
        assert all(r[2]["usage"]["completion_tokens"] == 4 for r in ok)
        for _, headers, body in refused:
            assert headers["Retry-After"] == "1" and body["error"]["code"] == "queue_full"
        assert wait_idle(srv.engine)
        m = metrics(srv)
        assert m["crucible_queue_peak"] == bound
        assert m['crucible_requests_rejected_total{cause="queue_full"}'] == 24 - bound
        assert m['crucible_requests_finished_total{reason="abort"}'] == 1  # the blocker
        assert m["crucible_pages_used"] == 0 and m["crucible_pages_used_peak"] <= 128
        assert srv.engine.allocator.num_free == 128
    finally:
        srv.stop()


def test_sdk_overload_errors_openai_429_and_anthropic_529():
    srv = start(max_queue=1, num_pages=128, step_delay=0.02)
    try:
        async def run() -> None:
            async with aiohttp.ClientSession() as s:
                blocker = await open_blocker(s, srv)
                queued = asyncio.create_task(s.post(srv.url + "/generate", json={
                    "prompt_token_ids": BURST_PROMPT, "max_tokens": 2}))
                await wait_for(lambda: metrics(srv)["crucible_requests_waiting"] == 1)

                def sdk_calls() -> None:
                    oa = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
                    with pytest.raises(openai.RateLimitError) as e1:
                        oa.completions.create(model=MODEL, prompt="hi", max_tokens=2)
                    assert e1.value.response.headers["retry-after"] == "1"
                    assert e1.value.body["code"] == "queue_full"
                    with pytest.raises(openai.RateLimitError):
                        oa.chat.completions.create(model=MODEL, max_tokens=2,
                                                   messages=[{"role": "user", "content": "x"}])
                    an = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
                    with pytest.raises(anthropic.OverloadedError) as e2:
                        an.messages.create(model=MODEL, max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}])
                    assert e2.value.status_code == 529
                    assert e2.value.body["error"]["type"] == "overloaded_error"

                await asyncio.to_thread(sdk_calls)
                blocker.close()
                r = await queued
                assert r.status == 200
                r.release()

        asyncio.run(run())
        assert wait_idle(srv.engine)
    finally:
        srv.stop()


def test_a_refusal_made_by_the_worker_is_still_a_429_not_a_failure(server):
    # AsyncLLMEngine checks the bound when a request arrives; the worker inserts it later.
    # If a preemption filled the queue in between, the worker refuses: that is overload.
    engine = server.engine
    real_add = engine.add_request

    def refuse(*args, **kwargs):
        from crucible.errors import QueueFullError

        raise QueueFullError("waiting queue is full (raced with a preemption)")

    engine.add_request = refuse
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    try:
        failures = metrics(server)["crucible_engine_failures_total"]
        with pytest.raises(openai.RateLimitError) as exc:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert exc.value.response.headers["retry-after"] == "1"
        assert metrics(server)["crucible_engine_failures_total"] == failures
    finally:
        engine.add_request = real_add
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens == 2
    assert wait_idle(engine)
