"""Anthropic-compatible API through the official ``anthropic`` SDK against a real loopback
server (tiny random model): messages, streaming events, stop reasons, count_tokens,
models and errors in Anthropic's shape."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anthropic
import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import wait_idle
from crucible.server.state import ServerConfig

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))
MODEL = "tiny-random"
HI = [{"role": "user", "content": "Hello there"}]
GREEDY = {"extra_body": {"temperature": 0}}  # this SDK no longer exposes sampling fields


@pytest.fixture(scope="module")
def server():
    with ServerThread(lambda: build_engine(*TINY), ServerConfig(model_name=MODEL)) as srv:
        srv.engine = srv.state.engine_loop.engine
        yield srv


@pytest.fixture
def client(server):
    yield anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    assert wait_idle(server.engine), "pages did not come back"


def raw_post(server, path: str, body: dict) -> tuple[int, dict, str]:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_message_stream_equals_non_stream(client):
    kw = dict(model=MODEL, max_tokens=8, messages=HI, **GREEDY)
    msg = client.messages.create(**kw)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 8 and msg.usage.input_tokens > 0
    assert msg._request_id and msg._request_id.startswith("req_")
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.usage.input_tokens == msg.usage.input_tokens


def test_stream_event_order(server):
    status, headers, text = raw_post(server, "/v1/messages",
                                     dict(model=MODEL, max_tokens=5, messages=HI, stream=True,
                                          temperature=0))
    assert status == 200 and headers["request-id"].startswith("req_")
    frames = [f.split("\n") for f in text.split("\n\n") if f]
    names = [f[0].removeprefix("event: ") for f in frames]
    datas = [json.loads(f[1].removeprefix("data: ")) for f in frames]
    assert [d["type"] for d in datas] == names
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"}
    assert datas[0]["message"]["usage"]["input_tokens"] > 0
    delta = datas[-2]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 5


def test_stop_sequence(client):
    kw = dict(model=MODEL, max_tokens=12, messages=HI, **GREEDY)
    full = client.messages.create(**kw).content[0].text
    assert len(full) >= 4
    seq = full[2:4]
    msg = client.messages.create(**kw, stop_sequences=[seq, "never-appears"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == seq
    assert msg.content[0].text == full[: full.find(seq)]
    with client.messages.stream(**kw, stop_sequences=[seq]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == seq
    assert final.content[0].text == msg.content[0].text


def test_system_multi_turn_prefill_and_count_tokens(client):
    turns = [{"role": "user", "content": "One"},
             {"role": "assistant", "content": [{"type": "text", "text": "Two"}]},
             {"role": "user", "content": [{"type": "text", "text": "Three"}]}]
    plain = client.messages.count_tokens(model=MODEL, messages=turns)
    with_system = client.messages.count_tokens(model=MODEL, messages=turns,
                                               system="You count.")
    assert with_system.input_tokens > plain.input_tokens > 0
    msg = client.messages.create(model=MODEL, max_tokens=2, messages=turns,
                                 system=[{"type": "text", "text": "You count."}])
    assert msg.usage.input_tokens == with_system.input_tokens
    # A final assistant turn is a prefill: the prompt ends with its text, no new turn.
    pre = client.messages.count_tokens(model=MODEL, messages=turns + [
        {"role": "assistant", "content": "Four"}])
    assert pre.input_tokens > with_system.input_tokens - 20


def test_models_list(client):
    models = list(client.models.list())
    assert [m.id for m in models] == [MODEL] and models[0].type == "model"


@pytest.mark.parametrize("body,fragment", [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "text"),
    ({"max_tokens": 4, "messages": HI, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 4, "messages": HI, "top_k": 0}, "top_k"),
    ({"max_tokens": 4, "messages": HI, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 4, "messages": HI, "presence_penalty": 1}, "presence_penalty"),
    ({"max_tokens": 5000, "messages": HI}, "5000"),
])
def test_bad_requests_are_400_in_anthropic_shape(server, client, body, fragment):
    status, headers, text = raw_post(server, "/v1/messages", {"model": MODEL, **body})
    err = json.loads(text)
    assert status == 400 and err["type"] == "error", text
    assert err["error"]["type"] == "invalid_request_error" and fragment in err["error"][
        "message"]
    assert headers["request-id"].startswith("req_")
    if "max_tokens" in body:  # the SDK itself refuses to send a request without it
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=body["max_tokens"], messages=HI,
                                   extra_body=body)


def test_unknown_model_and_malformed_json(server, client):
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="claude-nothing", max_tokens=2, messages=HI)
    assert exc.value.body["error"]["type"] == "not_found_error"
    req = urllib.request.Request(server.url + "/v1/messages", data=b"{oops",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req)
    body = json.loads(http.value.read())
    assert http.value.code == 400 and body["error"]["type"] == "invalid_request_error"
    with urllib.request.urlopen(server.url + "/health") as r:
        assert r.status == 200


def test_api_key_via_x_api_key():
    cfg = ServerConfig(model_name=MODEL, api_key="k-123")
    with ServerThread(lambda: build_engine(*TINY), cfg) as srv:
        with pytest.raises(anthropic.AuthenticationError) as exc:
            anthropic.Anthropic(base_url=srv.url, api_key="nope", max_retries=0
                                ).messages.create(model=MODEL, max_tokens=2, messages=HI)
        assert exc.value.body["error"]["type"] == "authentication_error"
        ok = anthropic.Anthropic(base_url=srv.url, api_key="k-123", max_retries=0)
        assert ok.messages.create(model=MODEL, max_tokens=2, messages=HI).usage.output_tokens \
            <= 2
