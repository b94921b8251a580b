"""Native API over real HTTP on loopback (tiny random model): /health, /generate, /tokenize,
/detokenize, /metrics, solo vs concurrent equality, and every malformed-input case."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import aiohttp
import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import parse_metrics, wait_idle

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))


def call(url: str, body: object | bytes | None = None, method: str | None = None
         ) -> tuple[int, dict, str]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None
                                                                     else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


@pytest.fixture(scope="module")
def server():
    with ServerThread(lambda: build_engine(*TINY)) as srv:
        srv.engine = srv.state.engine_loop.engine
        yield srv


@pytest.fixture(autouse=True)
def pages_back(request):
    yield
    if "server" in request.fixturenames:
        assert wait_idle(request.getfixturevalue("server").engine), "pages did not come back"


def generate(server, **body) -> dict:
    status, _, text = call(server.url + "/generate", body)
    assert status == 200, text
    return json.loads(text)


def test_health_is_503_until_the_model_is_ready():
    release = threading.Event()

    def slow_engine():
        assert release.wait(30)
        return build_engine(*TINY)

    srv = ServerThread(slow_engine).start(wait_loaded=False)
    try:
        status, _, text = call(srv.url + "/health")
        assert status == 503 and json.loads(text)["detail"] == "loading"
        status, _, text = call(srv.url + "/v1/models")
        assert status == 503 and "not ready" in json.loads(text)["error"]["message"]
        release.set()
        for _ in range(300):
            if call(srv.url + "/health")[0] == 200:
                break
            threading.Event().wait(0.02)
        assert call(srv.url + "/health")[0] == 200
        assert generate(srv, prompt="hi", max_tokens=2)["usage"]["completion_tokens"] == 2
    finally:
        release.set()
        srv.stop()


def test_generate_stream_equals_non_stream(server):
    body = dict(prompt="The quick brown fox", max_tokens=12, temperature=0, ignore_eos=True)
    whole = generate(server, **body)
    assert whole["finish_reason"] == "length" and len(whole["token_ids"]) == 12
    status, headers, text = call(server.url + "/generate", {**body, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    frames = [f[len("data: "):] for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    events = [json.loads(f) for f in frames[:-1]]
    assert [t for e in events for t in e["token_ids"]] == whole["token_ids"]
    assert "".join(e["text"] for e in events) == whole["text"]
    assert [e["finish_reason"] for e in events] == [None] * (len(events) - 1) + ["length"]


def test_streamed_text_is_utf8_safe_and_equals_a_full_decode(server):
    # A strong repetition penalty walks the tiny model through its byte tokens, so the
    # output contains multi-byte characters split across tokens; a token-by-token decode
    # would turn each into replacement characters. Frames must add up to the full decode.
    body = dict(prompt="日本語 – émoji 🎉 ✓", max_tokens=120, temperature=1.0, seed=3,
                ignore_eos=True, repetition_penalty=10.0, frequency_penalty=2.0, stream=True)
    status, _, text = call(server.url + "/generate", body)
    assert status == 200
    events = [json.loads(f[6:]) for f in text.split("\n\n") if f and f != "data: [DONE]"]
    ids = [t for e in events for t in e["token_ids"]]
    tok = server.engine.tokenizer
    full = tok.decode(ids, skip_special_tokens=True)
    naive = "".join(tok.decode([t], skip_special_tokens=True) for t in ids)
    assert any(ord(c) > 127 and c != "\ufffd" for c in full) and naive != full  # precondition
    assert "".join(e["text"] for e in events) == full
    whole = generate(server, **{**body, "stream": False})
    assert whole["token_ids"] == ids and whole["text"] == full


def test_generate_from_token_ids_matches_text_prompt(server):
    ids = json.loads(call(server.url + "/tokenize", {"prompt": "abc def"})[2])["tokens"]
    a = generate(server, prompt="abc def", max_tokens=6, temperature=0)
    b = generate(server, prompt_token_ids=ids, max_tokens=6, temperature=0)
    assert a["token_ids"] == b["token_ids"] and a["usage"]["prompt_tokens"] == len(ids)


def test_tokenize_detokenize_round_trip(server):
    text = "Grüße, 世界! <|im_start|>"
    status, _, out = call(server.url + "/tokenize", {"prompt": text, "return_token_strs": True})
    tok = json.loads(out)
    assert status == 200 and tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
    assert tok["max_model_len"] == 2048
    assert json.loads(call(server.url + "/detokenize", {"tokens": tok["tokens"]})[2])[
        "prompt"] == text
    chat = json.loads(call(server.url + "/tokenize",
                           {"messages": [{"role": "user", "content": "hi"}]})[2])
    assert chat["count"] > 2


def test_metrics_count_what_ran(server):
    before = parse_metrics(call(server.url + "/metrics")[2])
    out = generate(server, prompt="count me", max_tokens=7, ignore_eos=True)
    after = parse_metrics(call(server.url + "/metrics")[2])
    assert after["crucible_generation_tokens_total"] - before[
        "crucible_generation_tokens_total"] == 7
    assert after["crucible_prompt_tokens_total"] - before[
        "crucible_prompt_tokens_total"] == out["usage"]["prompt_tokens"]
    # The engine's own per-step counters: 7 sampled tokens; rows = the prompt's positions
    # not read from the prefix cache, plus 6 decode rows.
    cached = after["crucible_prefix_cache_hit_tokens_total"] - before[
        "crucible_prefix_cache_hit_tokens_total"]
    assert after["crucible_engine_generated_tokens_total"] - before[
        "crucible_engine_generated_tokens_total"] == 7
    assert after["crucible_engine_rows_total"] - before[
        "crucible_engine_rows_total"] == out["usage"]["prompt_tokens"] - cached + 6
    assert after["crucible_time_to_first_token_seconds_count"] == before[
        "crucible_time_to_first_token_seconds_count"] + 1
    assert after["crucible_inter_token_latency_seconds_count"] - before[
        "crucible_inter_token_latency_seconds_count"] == 6
    assert after['crucible_requests_finished_total{reason="length"}'] == before[
        'crucible_requests_finished_total{reason="length"}'] + 1
    assert after["crucible_pages_total"] == 256 and after["crucible_healthy"] == 1
    # The numpy backend has no graphs: every series there, every step eager.
    for kind in ("decode", "prefill", "mixed"):
        assert after[f'crucible_graph_replays_total{{kind="{kind}"}}'] == 0
    assert after["crucible_graph_captures_total"] == 0
    assert after["crucible_graph_capture_seconds_total"] == 0


def test_solo_and_concurrent_requests_give_identical_tokens(server):
    prompts = [f"request {i}: " + "x" * (3 + 7 * i) for i in range(6)]
    bodies = [dict(prompt=p, max_tokens=10, ignore_eos=True,
                   **({"temperature": 0} if i % 2 else {"temperature": 0.9, "seed": 100 + i}))
              for i, p in enumerate(prompts)]
    solo = [generate(server, **b)["token_ids"] for b in bodies]

    async def together() -> list[list[int]]:
        async with aiohttp.ClientSession() as s:
            async def one(b: dict) -> list[int]:
                async with s.post(server.url + "/generate", json=b) as r:
                    assert r.status == 200
                    return (await r.json())["token_ids"]
            return await asyncio.gather(*(one(b) for b in bodies))

    steps_before = server.engine.num_steps
    assert asyncio.run(together()) == solo
    # Shared steps happened: fewer steps than running them one after another would take.
    assert server.engine.num_steps - steps_before < 6 * 11


LONG = "word " * 500  # 2500 tokens of the tiny tokenizer: more than its 2048 context

# (path, body, fragments the error message must contain)
MALFORMED = [
    ("/generate", b"{not json", ["not valid JSON"]),
    ("/generate", b"[1, 2]", ["JSON object"]),
    ("/generate", b"", ["empty"]),
    ("/generate", {"prompt": ""}, ["empty"]),
    ("/generate", {"prompt_token_ids": []}, ["prompt_token_ids"]),
    ("/generate", {"prompt": 5}, ["'prompt' must be a string"]),
    ("/generate", {}, ["exactly one"]),
    ("/generate", {"prompt": "a", "prompt_token_ids": [1]}, ["exactly one"]),
    ("/generate", {"prompt": "a", "max_tokens": 0}, ["max_tokens", ">= 1"]),
    ("/generate", {"prompt": "a", "max_tokens": -3}, ["max_tokens"]),
    ("/generate", {"prompt": "a", "max_tokens": "5"}, ["max_tokens", "integer"]),
    ("/generate", {"prompt": "a", "max_tokens": True}, ["max_tokens", "integer"]),
    ("/generate", {"prompt": "a", "temperature": -1}, ["temperature"]),
    ("/generate", {"prompt": "a", "temperature": "hot"}, ["temperature"]),
    ("/generate", {"prompt": "a", "top_p": 0}, ["top_p"]),
    ("/generate", {"prompt": "a", "top_p": 1.5}, ["top_p"]),
    ("/generate", {"prompt": "a", "top_k": -7}, ["top_k"]),
    ("/generate", {"prompt": "a", "min_p": 2}, ["min_p"]),
    ("/generate", {"prompt": "a", "presence_penalty": 3}, ["presence_penalty"]),
    ("/generate", {"prompt": "a", "frequency_penalty": -2.5}, ["frequency_penalty"]),
    ("/generate", {"prompt": "a", "repetition_penalty": 0}, ["repetition_penalty"]),
    ("/generate", {"prompt": "a", "seed": -1}, ["seed"]),
    ("/generate", {"prompt": "a", "min_tokens": 9, "max_tokens": 4}, ["min_tokens"]),
    ("/generate", {"prompt": "a", "stop": [""]}, ["stop"]),
    ("/generate", {"prompt": "a", "stream": "yes"}, ["stream"]),
    ("/generate", {"prompt": "a", "logprobs": 50}, ["logprobs"]),
    ("/generate", {"prompt": "a", "bogus": 1}, ["unknown field", "bogus"]),
    ("/generate", {"prompt_token_ids": [99999]}, ["99999", "vocabulary"]),
    ("/generate", {"prompt": "hello", "max_tokens": 2047}, ["2047", "2048"]),
    ("/generate", {"prompt": LONG, "max_tokens": 1}, ["2500", "2048"]),
    ("/tokenize", {"prompt": 3}, ["string"]),
    ("/tokenize", {"messages": "hi"}, ["messages"]),
    ("/detokenize", {"tokens": ["a"]}, ["integers"]),
    ("/detokenize", {"tokens": [100000]}, ["100000"]),
]


@pytest.mark.parametrize("path,body,fragments", MALFORMED,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(MALFORMED)])
def test_malformed_input_is_a_400_and_the_server_keeps_serving(server, path, body, fragments):
    status, _, text = call(server.url + path, body)
    assert status == 400, text
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == \
        "invalid_request_error"
    for frag in fragments:
        assert frag in err["message"], err["message"]
    assert call(server.url + "/health")[0] == 200


def test_unknown_route_and_wrong_method_answer_in_json(server):
    status, _, text = call(server.url + "/nope")
    assert status == 404 and "no route" in json.loads(text)["error"]["message"]
    status, _, text = call(server.url + "/generate", method="GET")
    assert status == 405 and json.loads(text)["error"]["type"] == "invalid_request_error"


def test_health_and_service_after_every_bad_input(server):
    assert call(server.url + "/health")[0] == 200
    assert generate(server, prompt="still here", max_tokens=3)["usage"]["completion_tokens"] == 3
    m = parse_metrics(call(server.url + "/metrics")[2])
    assert m['crucible_requests_rejected_total{cause="invalid"}'] >= len(MALFORMED) - 1
