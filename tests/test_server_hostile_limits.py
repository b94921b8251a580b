"""Hostile input over real HTTP on loopback (tiny random model): the bounds on what one
request may ask (stop lists, body and prompt size, n against the queue bound, the response
budget) and the queue peak under refused bursts.

Every probe of the hostile-input pass is a 4xx (or a closed connection) in the API's own error
shape, never a 500, a stall of /health or a held-open socket; after each the server still
serves and every page is back in the pool (tests/hostile_client.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from hostile_client import (CHAT, MODEL, assert_serving, call, error_of, health_ms, metrics,
                            post_bytes, raw_exchange)
from hostile_client import limited, pages_back, server  # noqa: F401


# -- 2. stop lists ----------------------------------------------------------------------------

@pytest.mark.parametrize("path,field,limit", [("/generate", "stop", 16),
                                              ("/v1/messages", "stop_sequences", 16),
                                              ("/v1/completions", "stop", 4),
                                              ("/v1/chat/completions", "stop", 4)])
@pytest.mark.parametrize("count", [17, 100_000])
def test_stop_lists_are_capped(server, path, field, limit, count):
    body: dict = {"model": MODEL, "max_tokens": 2}
    body.update({"prompt": "hi"} if path in ("/generate", "/v1/completions") else
                {"messages": CHAT})
    if path == "/generate":
        del body["model"]
    body[field] = ["a"] * max(count, limit + 1)
    t0 = time.monotonic()
    status, _, text = call(server.url + path, body)
    assert status == 400, text
    assert time.monotonic() - t0 < 5
    message, param = error_of(path, status, text)
    assert f"at most {limit}" in message and field in message and param in (None, field)
    body[field] = ["b" * 257]
    status, _, text = call(server.url + path, body)
    assert status == 400 and "256 characters" in error_of(path, status, text)[0]
    body[field] = ["zz"] * limit
    assert call(server.url + path, body)[0] == 200
    assert_serving(server)


def test_million_entry_stop_list_is_refused_fast(server):
    body = json.dumps({"prompt": "hi", "stop": ["a"] * 1_000_000}).encode()  # 5 MB > 3 MiB
    t0 = time.monotonic()
    status, _, text = call(server.url + "/generate", body)
    assert status == 413 and time.monotonic() - t0 < 5, text
    assert "--max-body-bytes" in error_of("/generate", status, text)[0]
    assert_serving(server)


# -- 3. size before tokenising -----------------------------------------------------------------

async def _big_prompt_with_health(port: int, body: bytes) -> tuple[int, list[float]]:
    async def big() -> int:
        return (await raw_exchange(port, post_bytes("/v1/completions", body), 30))[0]

    task = asyncio.create_task(big())
    times = []
    while not task.done() or len(times) < 5:
        times.append(await health_ms(port))
        await asyncio.sleep(0.005)
        if len(times) > 200:
            break
    return await task, times


def test_two_megabyte_prompt_is_refused_while_health_answers(server, monkeypatch):
    # The refusal must come from the character count, before any tokenising: the
    # tokenizer never sees the text (a structural check, independent of machine load).
    tok = server.state.tokenizer
    seen: list[int] = []
    encode = tok.encode

    def recording_encode(text: str, *args, **kwargs):
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", recording_encode)
    body = json.dumps({"model": MODEL, "prompt": "the quick brown fox " * 100_000}).encode()
    assert len(body) > 2_000_000
    status, times = asyncio.run(_big_prompt_with_health(server.port, body))
    assert status == 400
    assert all(n < 100_000 for n in seen), seen
    # Tokenising 2 MB on the loop stalled /health for seconds; reading and counting it does
    # not. The bound is loose so a loaded CI machine passes, tight enough to catch a stall.
    assert max(times) < 1500, times
    status, _, text = call(server.url + "/v1/completions", body)
    message, param = error_of("/v1/completions", status, text)
    assert "characters" in message and "context" in message and param == "prompt"
    assert_serving(server)


def test_body_over_the_limit_is_a_413_in_json(server):
    for path in ("/generate", "/v1/messages"):
        body = json.dumps({"prompt": "x" * (3 << 20)}).encode()
        status, _, text = call(server.url + path, body)
        assert status == 413, text
        assert "--max-body-bytes" in error_of(path, status, text)[0]
    assert_serving(server)


def test_long_prompts_tokenise_off_the_loop_with_the_same_ids(server):
    tok = server.state.tokenizer
    for text in ("héllo wörld 字 " * 400, "<|im_start|>user\nhi " * 300, "x"):
        # encode goes through the GIL-releasing batch call: the single-text call's ids.
        single = tok.backend.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_bos=False) == single
        bos = tok.bos_token_id
        with_bos = single if single[:1] == [bos] else [bos] + single
        assert tok.encode(text, add_bos=True) == with_bos
    text = "héllo wörld " * 500  # 6,000 characters: tokenised in the pool
    status, _, out = call(server.url + "/tokenize", {"prompt": text})
    assert status == 200 and json.loads(out)["tokens"] == tok.encode(text)
    assert_serving(server)


# -- 4. n, queue peak, protocol errors, 500s ---------------------------------------------------

def test_n_over_the_queue_bound_is_a_400(limited):
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 8}),
                       ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "n": 5,
                                                 "max_tokens": 2}),
                       ("/v1/completions", {"model": MODEL, "prompt": ["a", "b", "c"],
                                            "n": 2, "max_tokens": 2})):
        status, headers, text = call(limited.url + path, body)
        assert status == 400 and "Retry-After" not in headers, text
        message, param = error_of(path, status, text)
        assert "--max-queue" in message and param == "n"
    status, _, text = call(limited.url + "/v1/completions",
                           {"model": MODEL, "prompt": "hi", "n": 4, "max_tokens": 2})
    assert status == 200, text
    assert_serving(limited)


def test_a_long_token_id_prompt_is_one_prompt(limited):
    """A flat id list is one prompt however long; only a list of prompts is held to the
    queue bound (max_queue 4 here)."""
    status, _, text = call(limited.url + "/v1/completions",
                           {"model": MODEL, "prompt": list(range(40, 60)), "max_tokens": 2})
    assert status == 200, text
    assert json.loads(text)["usage"]["prompt_tokens"] == 20
    status, _, text = call(limited.url + "/v1/completions",
                           {"model": MODEL, "prompt": [[40, 41]] * 5, "max_tokens": 2})
    assert status == 400 and "lists 5 prompts" in error_of("/v1/completions", status, text)[0]
    assert_serving(limited)


async def _burst(url: str, count: int) -> list[int]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.post(url + "/generate", json={
                    "prompt_token_ids": [70] * 40, "max_tokens": 4}) as r:
                await r.read()
                return r.status

        return await asyncio.gather(*(one() for _ in range(count)))


def test_queue_peak_counts_refused_bursts(limited):
    forward = limited.engine.runner.forward
    limited.engine.runner.forward = lambda b: (time.sleep(0.05), forward(b))[1]
    try:
        statuses = asyncio.run(_burst(limited.url, 16))
    finally:
        limited.engine.runner.forward = forward
    assert 429 in statuses and set(statuses) <= {200, 429}, statuses
    m = metrics(limited)
    assert m["crucible_queue_peak"] == 4, m["crucible_queue_peak"]
    assert m["crucible_requests_waiting_peak"] >= 4
    assert_serving(limited)


# -- 5. response budget ------------------------------------------------------------------------

def test_response_budget(server, limited):
    cases = [(server, "/v1/chat/completions",
              {"model": MODEL, "messages": CHAT, "n": 8, "logprobs": True, "top_logprobs": 20,
               "max_tokens": 2000}, "8 x 2000 x 21"),
             (server, "/v1/completions",
              {"model": MODEL, "prompt": "hi", "n": 16, "logprobs": 20, "max_tokens": 1000},
              "16 x 1000 x 21"),
             (server, "/generate", {"prompt": "hi", "logprobs": 20, "max_tokens": 15000},
              "1 x 15000 x 21"),
             (limited, "/v1/messages", {"model": MODEL, "messages": CHAT, "max_tokens": 1500},
              "1 x 1500 x 1")]
    for srv, path, body, product in cases:
        t0 = time.monotonic()
        status, _, text = call(srv.url + path, body)
        assert status == 400 and time.monotonic() - t0 < 2, text
        message, _ = error_of(path, status, text)
        assert product in message and str(srv.state.config.max_response_entries) in message
        assert "--max-response-entries" in message
    assert_serving(server)
    assert_serving(limited)
