"""The server's first minute with third-party clients and operators: one access-log line per
request (method, path, status, tokens, ms), vLLM's GET /tokenizer_info (lm-evaluation-
harness asks for it first), and max_completion_tokens on /v1/completions as on the chat
route (both given and different: a 400 naming both)."""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request

import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.state import ServerConfig

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))
MODEL = "tiny"


def _parse(raw: bytes) -> object:
    try:
        return json.loads(raw or b"null")
    except ValueError:
        return raw.decode()  # an SSE stream


def call(url: str, body: object | None = None, method: str | None = None,
         headers: dict | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, _parse(r.read())
    except urllib.error.HTTPError as e:
        return e.code, _parse(e.read())


@pytest.fixture(scope="module")
def server():
    with ServerThread(lambda: build_engine(*TINY), ServerConfig(model_name=MODEL)) as srv:
        yield srv


def access_lines(caplog, n: int, timeout: float = 5.0) -> list[str]:
    """The access lines so far, waiting (briefly) until there are at least ``n``: a line is
    written when the handler returns, which may be just after the client read its bytes."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [r.getMessage() for r in caplog.records if r.name == "crucible.server.access"]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


# -- access log ---------------------------------------------------------------------------

LINE = re.compile(r"^(?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3}|-)"
                  r"(?: prompt_tokens=(?P<prompt>\d+) output_tokens=(?P<output>\d+))?"
                  r" (?P<ms>\d+\.\d) ms id=(?P<id>\S+)$")


def test_access_log_line_per_request(server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="crucible.server.access")
    status, out = call(server.url + "/v1/completions",
                       {"model": MODEL, "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
    assert status == 200, out
    status, _ = call(server.url + "/health")
    assert status == 200
    status, _ = call(server.url + "/no/such/route")
    assert status == 404
    status, out = call(server.url + "/v1/chat/completions",
                       {"model": MODEL, "max_tokens": 2, "stream": True, "ignore_eos": True,
                        "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and out.endswith("data: [DONE]\n\n")
    lines = access_lines(caplog, 4)
    assert len(lines) == 4, lines
    parsed = [LINE.match(x) for x in lines]
    assert all(parsed), lines
    by_path = {m["path"]: m for m in parsed}
    cmpl = by_path["/v1/completions"]
    assert cmpl["method"] == "POST" and cmpl["status"] == "200"
    assert int(cmpl["prompt"]) == out_prompt_tokens(server, "hello") and cmpl["output"] == "3"
    assert cmpl["id"].startswith("req_")
    health = by_path["/health"]
    assert health["method"] == "GET" and health["status"] == "200" and health["prompt"] is None
    assert by_path["/no/such/route"]["status"] == "404"
    chat = by_path["/v1/chat/completions"]
    assert chat["status"] == "200" and chat["output"] == "2" and int(chat["prompt"]) > 0


def out_prompt_tokens(server, text: str) -> int:
    status, out = call(server.url + "/tokenize", {"prompt": text})
    assert status == 200
    return out["count"]


def test_access_log_counts_n_choices_and_rejections(server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="crucible.server.access")
    status, out = call(server.url + "/v1/completions",
                       {"model": MODEL, "prompt": "hello", "max_tokens": 2, "n": 3,
                        "ignore_eos": True})
    assert status == 200, out
    assert out["usage"]["completion_tokens"] == 6
    status, _ = call(server.url + "/v1/completions", {"model": MODEL, "prompt": "x",
                                                      "max_tokens": 0})
    assert status == 400
    lines = access_lines(caplog, 2)
    first, second = (LINE.match(x) for x in lines[:2])
    # prompt tokens count once per distinct prompt, as usage does
    assert first["prompt"] == str(out["usage"]["prompt_tokens"]) and first["output"] == "6"
    assert second["status"] == "400" and second["prompt"] is None


def test_access_log_path_cannot_forge_lines(server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="crucible.server.access")
    call(server.url + "/a%0aGET%20/fake%20200")
    (line,) = access_lines(caplog, 1)
    assert "\n" not in line and LINE.match(line) and " /a%0aGET%20/fake%20200 404 " in line


def test_access_log_is_quiet_above_info(server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="crucible.server.access")
    call(server.url + "/health")
    time.sleep(0.1)
    assert not [r for r in caplog.records if r.name == "crucible.server.access"]


# -- GET /tokenizer_info ------------------------------------------------------------------

def test_tokenizer_info_like_vllm(server) -> None:
    status, info = call(server.url + "/tokenizer_info")
    assert status == 200, info
    engine = server.state.engine_loop.engine
    tok = engine.tokenizer
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["model_max_length"] == engine.max_context
    assert info["vocab_size"] == tok.vocab_size
    assert info["eos_token_id"] == tok.eos_token_id
    assert info["eos_token"] == (None if tok.eos_token_id is None
                                 else tok.id_to_token(tok.eos_token_id))
    assert info["bos_token"] == (None if tok.bos_token_id is None
                                 else tok.id_to_token(tok.bos_token_id))
    assert isinstance(info["chat_template"], str) and "messages" in info["chat_template"]
    assert info["chat_template_is_fallback"] is (not tok.has_chat_template)
    json.dumps(info)


def test_lm_eval_remote_tokenizer_shape(server) -> None:
    """What lm-evaluation-harness's remote tokenizer does with a server (its RemoteTokenizer,
    read 2026-12: base URL with /v1/completions stripped): /tokenizer_info must carry
    "eos_token"; the eos id is /tokenize of that text with add_special_tokens false; ids
    come back through /detokenize's "prompt"; the chat template renders in a jinja2
    environment with StrictUndefined from messages and add_generation_prompt alone."""
    import jinja2

    tok = server.state.engine_loop.engine.tokenizer
    status, info = call(server.url + "/tokenizer_info")
    assert status == 200 and "eos_token" in info and isinstance(info["eos_token"], str)

    def encode(text: str) -> list[int]:
        status, out = call(server.url + "/tokenize",
                           {"prompt": text, "add_special_tokens": False})
        assert status == 200 and isinstance(out["tokens"], list), out
        return out["tokens"]

    assert encode(info["eos_token"])[0] == tok.eos_token_id  # the special token, whole
    ids = encode("test, and a longer line")
    status, out = call(server.url + "/detokenize", {"tokens": ids})
    assert status == 200 and out["prompt"] == "test, and a longer line"
    env = jinja2.Environment(loader=jinja2.BaseLoader(), undefined=jinja2.StrictUndefined)
    text = env.from_string(info["chat_template"]).render(
        messages=[{"role": "user", "content": "hi there"}], add_generation_prompt=True)
    assert "hi there" in text


def test_tokenizer_info_needs_the_api_key() -> None:
    with ServerThread(lambda: build_engine(*TINY), ServerConfig(api_key="k")) as srv:
        assert call(srv.url + "/tokenizer_info")[0] == 401
        status, info = call(srv.url + "/tokenizer_info", headers={"Authorization": "Bearer k"})
        assert status == 200 and "chat_template" in info


# -- max_completion_tokens ----------------------------------------------------------------

def test_completions_accepts_max_completion_tokens(server) -> None:
    body = {"model": MODEL, "prompt": "hello", "ignore_eos": True, "temperature": 0}
    status, a = call(server.url + "/v1/completions", {**body, "max_completion_tokens": 4})
    assert status == 200, a
    assert a["usage"]["completion_tokens"] == 4 and a["choices"][0]["finish_reason"] == "length"
    status, b = call(server.url + "/v1/completions", {**body, "max_tokens": 4})
    assert status == 200 and b["choices"][0]["text"] == a["choices"][0]["text"]
    status, c = call(server.url + "/v1/completions",
                     {**body, "max_tokens": 4, "max_completion_tokens": 4})
    assert status == 200 and c["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("route, extra", [
    ("/v1/completions", {"prompt": "hello"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_max_tokens_aliases_that_differ_are_a_400_naming_both(server, route, extra) -> None:
    status, out = call(server.url + route, {"model": MODEL, "max_tokens": 3,
                                            "max_completion_tokens": 5, **extra})
    assert status == 400, out
    msg = out["error"]["message"]
    assert "'max_completion_tokens' (5)" in msg and "'max_tokens' (3)" in msg
    assert out["error"]["param"] == "max_completion_tokens"


@pytest.mark.parametrize("value, words", [(0, "must be >= 1"), ("ten", "must be an integer")])
def test_completions_max_completion_tokens_is_validated(server, value, words) -> None:
    status, out = call(server.url + "/v1/completions",
                       {"model": MODEL, "prompt": "hello", "max_completion_tokens": value})
    assert status == 400 and words in out["error"]["message"], out
    assert out["error"]["param"] == "max_completion_tokens"
