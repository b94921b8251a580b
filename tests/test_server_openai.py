"""OpenAI-compatible API through the official ``openai`` SDK against a real loopback server
(tiny random model): models, completions, chat, streaming == non-streaming, usage, finish
reasons, n/echo/logprobs, API key and error mapping."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import wait_idle
from crucible.server.state import ServerConfig

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))
MODEL = "tiny-random"
NO_EOS = {"ignore_eos": True}  # the tiny model may sample its EOS early; lengths must be fixed


@pytest.fixture(scope="module")
def server():
    with ServerThread(lambda: build_engine(*TINY), ServerConfig(model_name=MODEL)) as srv:
        srv.engine = srv.state.engine_loop.engine
        yield srv


@pytest.fixture
def client(server):
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert wait_idle(server.engine), "pages did not come back"


def tokens_of(server, text: str) -> int:
    req = urllib.request.Request(server.url + "/tokenize",
                                 data=json.dumps({"prompt": text}).encode())
    with urllib.request.urlopen(req) as r:
        return json.load(r)["count"]


def test_models_list_and_retrieve(client):
    models = client.models.list()
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nothing")


def test_completion_stream_equals_non_stream_and_usage(client, server):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0,
              extra_body=NO_EOS)
    whole = client.completions.create(**kw)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 10
    assert whole.usage.prompt_tokens == tokens_of(server, "Once upon a time")
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_equals_non_stream_with_role_first_and_done_last(client, server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More"}]
    kw = dict(model=MODEL, messages=msgs, max_tokens=9, temperature=0, extra_body=NO_EOS)
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 9
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    # The raw stream ends with data: [DONE] (the SDK hides it).
    body = json.dumps({**{k: v for k, v in kw.items() if k != "extra_body"}, **NO_EOS,
                       "stream": True}).encode()
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        frames = [f for f in r.read().decode().split("\n\n") if f]
    assert frames[-1] == "data: [DONE]" and '"role": "assistant"' in frames[0]


def test_max_completion_tokens_and_default_chat_limit(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_completion_tokens=3, extra_body=NO_EOS)
    assert r.usage.completion_tokens == 3
    # Without a limit a chat may run to the end of the context: prompt + output = 2048.
    long = "word " * 400  # about 2000 tokens, so the rest of the context is short
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}],
                                       temperature=0, extra_body=NO_EOS)
    assert 1900 < r.usage.prompt_tokens < 2048
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 2048


def test_stop_string_and_stop_token_finish_with_stop(client):
    base = dict(model=MODEL, prompt="abcabc", max_tokens=12, temperature=0, extra_body=NO_EOS)
    full = client.completions.create(**base).choices[0].text
    assert len(full) >= 4
    stop = full[2:4]
    r = client.completions.create(**base | {"stop": [stop]})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.find(stop)]
    ids = client.completions.create(**base | {"logprobs": 0}).choices[0].logprobs
    assert len(ids.tokens) == 12
    # A stop token ends the request at its first occurrence and its text is not shown.
    tid = json.loads(urllib.request.urlopen(urllib.request.Request(
        client.base_url.__str__().replace("/v1/", "/tokenize"),
        data=json.dumps({"prompt": full[0]}).encode())).read())["tokens"][0]
    r = client.completions.create(**base | {"extra_body": {**NO_EOS, "stop_token_ids": [tid]}})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
    assert r.choices[0].text == ""


def test_n_choices_echo_and_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=["alpha", "beta"], n=3, max_tokens=4,
                                  temperature=1.0, seed=11, extra_body=NO_EOS)
    assert sorted(c.index for c in r.choices) == list(range(6))
    assert r.usage.completion_tokens == 24
    again = client.completions.create(model=MODEL, prompt=["alpha", "beta"], n=3,
                                      max_tokens=4, temperature=1.0, seed=11, extra_body=NO_EOS)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # seeded: repeatable
    e = client.completions.create(model=MODEL, prompt="alpha", echo=True, max_tokens=3,
                                  logprobs=2, temperature=0, extra_body=NO_EOS)
    lp = e.choices[0].logprobs
    assert e.choices[0].text.startswith("alpha")
    n_prompt = e.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 3 and lp.token_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(t) <= 3 for t in lp.top_logprobs[1:])  # top 2 (+ the sampled token)
    assert "".join(lp.tokens) == e.choices[0].text
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}],
                                       max_tokens=3, logprobs=True, top_logprobs=2,
                                       temperature=0, extra_body=NO_EOS)
    content = c.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)
    # Greedy: the chosen token is the most likely one.
    assert all(t.logprob == t.top_logprobs[0].logprob for t in content)


def test_chat_n_choices_stream_like_non_stream(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "pick"}], n=3, max_tokens=5,
              temperature=1.0, seed=21, extra_body=NO_EOS)
    whole = client.chat.completions.create(**kw)
    texts = {c.index: c.message.content for c in whole.choices}
    assert sorted(texts) == [0, 1, 2] and whole.usage.completion_tokens == 15
    streamed: dict[int, str] = {0: "", 1: "", 2: ""}
    roles, finishes = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.index)
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes.append((c.index, c.finish_reason))
    assert roles == [0, 1, 2] and streamed == texts
    assert sorted(finishes) == [(0, "length"), (1, "length"), (2, "length")]


def test_penalties_and_seed_accepted_and_reproducible(client):
    kw = dict(model=MODEL, prompt="zz", max_tokens=8, temperature=0.8, seed=5,
              presence_penalty=0.5, frequency_penalty=0.5, extra_body=NO_EOS)
    assert client.completions.create(**kw).choices[0].text == \
        client.completions.create(**kw).choices[0].text


@pytest.mark.parametrize("kw,param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 3.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"n": 0}, "n"),
    ({"logprobs": 21}, "logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"max_tokens": 2040, "prompt": "a long enough prompt"}, "max_tokens"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
])
def test_bad_completion_requests_are_400_in_openai_shape(client, kw, param):
    args = dict(model=MODEL, prompt="hi", max_tokens=2) | kw
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(**args)
    err = exc.value.body
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_bad_chat_requests_are_400(client):
    for kw in ({"messages": []}, {"messages": [{"role": "robot", "content": "x"}]},
               {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
               {"tools": [{"type": "function", "function": {"name": "f"}}]},
               {"top_logprobs": 3}):
        args = dict(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2) | kw
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(**args)
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="other", messages=[{"role": "user",
                                                                 "content": "x"}])
    assert exc.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("bias,refused", [({}, None), (None, None),
                                          ({"5": 1}, "not supported"),
                                          (False, "must be an object"),
                                          ([1], "must be an object")])
def test_logit_bias_empty_or_null_only(client, bias, refused):
    """logit_bias is an object or null (OpenAI's type); an empty one asks nothing, any
    entry is refused by name, and another type is named as one."""
    for create, kw in ((client.completions.create, {"prompt": "hi"}),
                       (client.chat.completions.create,
                        {"messages": [{"role": "user", "content": "hi"}]})):
        args = dict(model=MODEL, max_tokens=2, extra_body={"logit_bias": bias}) | kw
        if refused is None:
            assert create(**args).usage.completion_tokens >= 1
            continue
        with pytest.raises(openai.BadRequestError) as exc:
            create(**args)
        assert exc.value.body["param"] == "logit_bias" and refused in exc.value.body["message"]


def test_api_key_is_required_when_configured():
    cfg = ServerConfig(model_name=MODEL, api_key="sekret")
    with ServerThread(lambda: build_engine(*TINY), cfg) as srv:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as exc:
            bad.models.list()
        assert exc.value.status_code == 401 and exc.value.body["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                       extra_body=NO_EOS).usage.completion_tokens == 2
        with urllib.request.urlopen(srv.url + "/health") as r:  # probes need no key
            assert r.status == 200
