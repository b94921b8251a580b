"""Overload, cancellation and faults over real HTTP (tiny random model).

- a full waiting queue answers 429 (Anthropic: 529 overloaded_error) at once, with
  Retry-After; a burst of 24 against bounds 1-4 splits exactly into bound accepted + rest
  refused, and every page comes back;
- a client that disconnects (streaming, non-streaming, mid-prefill) aborts its request and
  its pages return;
- a step that raises fails the in-flight requests with 500 and the server keeps serving; a
  failure that loses pages turns /health to 503.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

import aiohttp
import anthropic
import openai
import pytest

from crucible.engine.factory import build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import parse_metrics, wait_idle
from crucible.server.state import ServerConfig

MODEL = "tiny-random"
BLOCKER_PROMPT = [65] * 1900  # 119 of 128 pages: nothing of 10+ pages can be admitted
BURST_PROMPT = [66] * 150  # its first slice needs 10 pages


def start(max_queue: int = 64, num_pages: int = 256, token_budget: int = 1024,
          step_delay: float = 0.0, **cfg) -> ServerThread:
    settings = Settings(device="cpu", weights="f32", num_pages=num_pages,
                        token_budget=token_budget, max_queue=max_queue)

    def make():
        engine, info = build_engine(MODEL, settings)
        if step_delay:  # a slower engine widens the window in which the pool stays full
            forward = engine.runner.forward
            engine.runner.forward = lambda b: (time.sleep(step_delay), forward(b))[1]
        return engine, info

    srv = ServerThread(make, ServerConfig(model_name=MODEL, max_queue=max_queue, **cfg)).start()
    srv.engine = srv.state.engine_loop.engine
    return srv


def metrics(srv) -> dict[str, float]:
    with urllib.request.urlopen(srv.url + "/metrics") as r:
        return parse_metrics(r.read().decode())


async def open_blocker(session: aiohttp.ClientSession, srv) -> aiohttp.ClientResponse:
    """Stream a request that holds nearly every page; return once it is decoding."""
    resp = await session.post(srv.url + "/generate", json={
        "prompt_token_ids": BLOCKER_PROMPT, "max_tokens": 147, "ignore_eos": True,
        "stream": True})
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")  # the first token: prefill is done
    return resp


async def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


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


@pytest.fixture(scope="module")
def server():
    srv = start(num_pages=256)
    yield srv
    srv.stop()


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
        assert wait_idle(srv.engine, timeout=5)
        assert srv.engine.num_generated - generated < 1900
        after = metrics(srv)
        key = 'crucible_requests_finished_total{reason="abort"}'
        assert after[key] == before[key] + 2
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


def test_engine_failure_fails_requests_with_500_and_server_recovers():
    srv = start(num_pages=64)
    fail = threading.Event()
    forward = srv.engine.runner.forward

    def flaky(batch):
        if fail.is_set():
            raise RuntimeError("injected device fault")
        return forward(batch)

    srv.engine.runner.forward = flaky
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    try:
        fail.set()
        with pytest.raises(openai.InternalServerError) as exc:
            client.completions.create(model=MODEL, prompt="x", max_tokens=3)
        assert exc.value.status_code == 500 and "internal error" in exc.value.message
        assert "injected" not in exc.value.message and "RuntimeError" not in exc.value.message
        body = json.dumps({"prompt": "x", "max_tokens": 3, "stream": True}).encode()
        with urllib.request.urlopen(urllib.request.Request(srv.url + "/generate",
                                                           data=body)) as r:
            frames = [f for f in r.read().decode().split("\n\n") if f]
        assert "internal error" in frames[-2] and frames[-1] == "data: [DONE]"
        assert "injected" not in frames[-2] and "RuntimeError" not in frames[-2]
        body = json.dumps({"model": MODEL, "max_tokens": 3, "stream": True,
                           "messages": [{"role": "user", "content": "x"}]}).encode()
        with urllib.request.urlopen(urllib.request.Request(srv.url + "/v1/messages",
                                                           data=body)) as r:
            frames = [f for f in r.read().decode().split("\n\n") if f]
        assert frames[0].startswith("event: message_start")
        assert frames[-1].startswith("event: error") and '"api_error"' in frames[-1]
        fail.clear()
        assert client.completions.create(model=MODEL, prompt="x", max_tokens=3,
                                         extra_body={"ignore_eos": True}
                                         ).usage.completion_tokens == 3
        assert wait_idle(srv.engine)
        time.sleep(0.3)  # past the post-failure pool check
        with urllib.request.urlopen(srv.url + "/health") as r:
            assert r.status == 200
        m = metrics(srv)
        assert m["crucible_engine_failures_total"] == 3
        assert m['crucible_requests_finished_total{reason="error"}'] == 3
    finally:
        srv.stop()


def test_failure_that_loses_pages_makes_health_503():
    srv = start(num_pages=64)
    engine = srv.engine

    def leaky(batch):
        engine.allocator.allocate(1)  # a page no request owns any more
        raise RuntimeError("corrupting fault")

    engine.runner.forward = leaky
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    try:
        with pytest.raises(openai.InternalServerError):
            client.completions.create(model=MODEL, prompt="x", max_tokens=3)
        deadline = time.monotonic() + 5
        status = 200
        while status == 200 and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(srv.url + "/health")
                time.sleep(0.05)
            except urllib.error.HTTPError as e:
                status = e.code
        assert status == 503
        with pytest.raises(openai.APIStatusError) as exc:  # and requests are refused honestly
            client.completions.create(model=MODEL, prompt="x", max_tokens=3)
        assert exc.value.status_code == 503
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
