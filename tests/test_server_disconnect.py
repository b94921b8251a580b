"""Cancellation over real HTTP (tiny random model): a client that disconnects
(streaming, non-streaming, mid-prefill) aborts its request and its pages return."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import openai
import pytest

from crucible.server.probe import wait_idle
from overload_server import MODEL, metrics, start, wait_for
from overload_server import server  # noqa: F401


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_disconnect_mid_stream_returns_every_page(server):
    before = metrics(server)
    generated = server.engine.num_generated

    async def run() -> None:
        async with aiohttp.ClientSession() as s:
            resp = await s.post(server.url + "/generate", json={
                "prompt": "stream me", "max_tokens": 1500, "ignore_eos": True, "stream": True})
            for _ in range(3):
                await resp.content.readuntil(b"\n\n")
            assert server.engine.has_unfinished()
            resp.close()

    asyncio.run(run())
    assert wait_idle(server.engine, timeout=5)
    after = metrics(server)
    assert after['crucible_requests_finished_total{reason="abort"}'] == before[
        'crucible_requests_finished_total{reason="abort"}'] + 1
    # The engine itself stopped early (not just the response): far fewer than 1500 tokens.
    assert server.engine.num_generated - generated < 500


def test_sdk_stream_close_and_non_stream_disconnect_abort():
    # A slowed engine (2 ms a step: 1,900 tokens take at least 3.8 s), so neither request can
    # reach its own end before the client gives up; the test then sees the abort itself.
    srv = start(num_pages=256, step_delay=0.002)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        before = metrics(srv)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "go"}], max_tokens=1500,
            stream=True, extra_body={"ignore_eos": True})
        generated = srv.engine.num_generated
        for _, _chunk in zip(range(3), stream):
            pass
        stream.close()
        assert wait_idle(srv.engine, timeout=5)
        assert srv.engine.num_generated - generated < 1500
        # Non-streaming: the client gives up after 0.3 s; the server must notice and abort.
        short = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                              timeout=0.3)
        generated = srv.engine.num_generated
        with pytest.raises(openai.APITimeoutError):
            short.completions.create(model=MODEL, prompt="long", max_tokens=1900,
                                     extra_body={"ignore_eos": True})
        # The handler counts the abort after queueing it; until then the request may still
        # sit in the worker's pending adds, which an idle probe of the engine cannot see.
        key = 'crucible_requests_finished_total{reason="abort"}'
        assert wait_until(lambda: metrics(srv)[key] == before[key] + 2, timeout=5)
        assert wait_idle(srv.engine, timeout=5)
        assert srv.engine.num_generated - generated < 1900
        assert metrics(srv)[key] == before[key] + 2
        assert srv.engine.allocator.num_free == srv.engine.allocator.num_pages
    finally:
        srv.stop()


def test_disconnect_mid_prefill_aborts_before_the_first_token():
    srv = start(num_pages=128, token_budget=8)  # 1500 prompt tokens: 188 prefill steps
    try:
        before = metrics(srv)

        async def run() -> tuple[int, int]:
            async with aiohttp.ClientSession() as s:
                resp = await s.post(srv.url + "/generate", json={
                    "prompt_token_ids": [70] * 1500, "max_tokens": 4, "stream": True})
                await wait_for(lambda: any(r.num_computed_tokens > 0
                                           for r in list(srv.engine.requests.values())))
                computed = max(r.num_computed_tokens for r in srv.engine.requests.values())
                resp.close()
                return computed, srv.engine.num_steps

        computed, steps_at_close = asyncio.run(run())
        assert computed < 1500
        assert wait_idle(srv.engine, timeout=5)
        after = metrics(srv)
        assert after["crucible_generation_tokens_total"] == before[
            "crucible_generation_tokens_total"]  # no token was ever sampled
        # The abort landed long before prefill could have finished on its own.
        assert srv.engine.num_steps - steps_at_close < (1500 - computed) // 8
    finally:
        srv.stop()
