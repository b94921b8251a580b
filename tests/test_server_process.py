"""The engine in its own process serves what the in-process engine serves: the same bodies
and the same streamed frames (ids, text pieces, finish reasons, logprobs, usage) on the
native, OpenAI and Anthropic routes, greedy and seeded, with stop strings and stop ids,
streaming and not. Two servers of one tiny random model, the same requests to both."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.engine_client import EngineClient, EngineProcessConfig
from crucible.server.launch import ServerThread
from crucible.server.state import ServerConfig
from engine_process_kit import wait_idle

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))
MODEL = "tiny-random"
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def servers():
    cfg = ServerConfig(model_name=MODEL)
    here = ServerThread(lambda: build_engine(*TINY), cfg).start()
    there = ServerThread(EngineProcessConfig(*TINY), cfg)
    try:
        there.start()
        assert isinstance(there.state.engine_loop, EngineClient)
        yield here, there
    finally:
        here.stop()
        there.stop()


@pytest.fixture(autouse=True)
def idle_after(servers):
    yield
    for srv in servers:  # every request ended in the engine, every page is back
        wait_idle(srv)


def post(srv, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrub(obj):
    """Drop what differs by design between two servers (ids, timestamps)."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items() if k not in ("id", "created")}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def parse(text: str, stream: bool):
    if not stream:
        return scrub(json.loads(text))
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = lines["data"]
        frames.append((lines.get("event"), data if data == "[DONE]" else scrub(json.loads(data))))
    return frames


def by_choice(frames: list) -> list:
    """Frames of several choices interleave as their requests' tasks run (so, in-process
    too, in no fixed order); each choice's own frames keep theirs."""
    def index(frame):
        choices = frame[1].get("choices") if isinstance(frame[1], dict) else None
        return choices[0]["index"] if choices else 1 << 30

    return sorted(frames, key=index)


def same(servers, path: str, body: dict) -> list:
    """Both servers' answers, streamed and not, are equal; returns the non-streamed one
    and the frames."""
    out = []
    for stream in (False, True):
        got = []
        for srv in servers:
            status, text = post(srv, path, {**body, "stream": stream})
            assert status == 200, text
            got.append(by_choice(parse(text, True)) if stream else parse(text, False))
        assert got[0] == got[1], (path, body, stream)
        out.append(got[0])
    return out


def test_native_generate_matches(servers):
    probe, _ = same(servers, "/generate", {"prompt": "the cat sat", "max_tokens": 40,
                                           "temperature": 1.0, "seed": 3, "ignore_eos": True})
    text, ids = probe["text"], probe["token_ids"]
    mid = len(text) // 2
    bodies = [
        {"prompt": "hello world", "max_tokens": 24, "temperature": 0, "logprobs": 2},
        {"prompt_token_ids": [270, 65, 258, 66], "max_tokens": 16, "temperature": 0.8,
         "seed": 11, "top_k": 50, "logprobs": 0},
        # the probe again, ended by a stop string, a stop id, and a stop after min_tokens
        {"prompt": "the cat sat", "max_tokens": 40, "temperature": 1.0, "seed": 3,
         "ignore_eos": True, "stop": [text[mid : mid + 2]]},
        {"prompt": "the cat sat", "max_tokens": 40, "temperature": 1.0, "seed": 3,
         "stop_token_ids": [ids[9]]},
        {"prompt": "the cat sat", "max_tokens": 40, "temperature": 1.0, "seed": 3,
         "ignore_eos": True, "stop": [text[:2]], "min_tokens": 12},
    ]
    answers = [same(servers, "/generate", b)[0] for b in bodies]
    assert answers[2]["finish_reason"] == answers[3]["finish_reason"] == "stop"
    assert len(answers[2]["token_ids"]) < 40 and text[mid : mid + 2] not in answers[2]["text"]
    assert len(answers[3]["token_ids"]) <= 10


def test_openai_completions_match(servers):
    base = {"model": MODEL, "prompt": ["once upon", "a time"], "max_tokens": 12,
            "temperature": 0.9, "seed": 21, "n": 2, "logprobs": 2}
    whole, frames = same(servers, "/v1/completions", {**base, "stream_options":
                                                      {"include_usage": True}})
    assert len(whole["choices"]) == 4 and (None, "[DONE]") in frames
    echoed, _ = same(servers, "/v1/completions", {**base, "echo": True, "n": 1,
                                                  "stop": ["e", "a"]})
    assert all(c["logprobs"]["token_logprobs"][0] is None for c in echoed["choices"])
    same(servers, "/v1/completions", {"model": MODEL, "prompt": [65, 66, 67],
                                      "max_tokens": 20, "temperature": 0})


def test_openai_chat_matches(servers):
    whole, _ = same(servers, "/v1/chat/completions", {
        "model": MODEL, "messages": CHAT, "max_tokens": 30, "temperature": 1.0,
        "seed": 4, "logprobs": True, "top_logprobs": 3})
    text = whole["choices"][0]["message"]["content"]
    same(servers, "/v1/chat/completions", {
        "model": MODEL, "messages": CHAT, "max_tokens": 30, "temperature": 1.0,
        "seed": 4, "stop": [text[len(text) // 2 :][:2] or "x"]})
    same(servers, "/v1/chat/completions", {"model": MODEL, "messages": CHAT,
                                           "max_completion_tokens": 8, "temperature": 0})


def test_anthropic_messages_match(servers):
    body = {"model": MODEL, "max_tokens": 20, "messages": CHAT[1:], "system": "be brief",
            "temperature": 0}
    whole, frames = same(servers, "/v1/messages", body)
    text = whole["content"][0]["text"]
    assert frames[0][0] == "message_start" and frames[-1][0] == "message_stop"
    stopped, _ = same(servers, "/v1/messages", {**body, "stop_sequences": [text[3:5]]})
    assert stopped["stop_reason"] == "stop_sequence"


def test_refusals_come_at_once_as_in_process(servers):
    """The engine's own checks run on the front: a stream the engine would refuse is a
    400 JSON, never a 200 stream with an error in it."""
    for body in ({"prompt_token_ids": [65, 99999], "max_tokens": 4},
                 {"prompt_token_ids": [65] * 2040, "max_tokens": 9},
                 {"prompt": "x", "max_tokens": 4, "temperature": -1}):
        got = [post(srv, "/generate", {**body, "stream": True}) for srv in servers]
        assert got[0] == got[1] and got[0][0] == 400, got
