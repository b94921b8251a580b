"""The prefix cache through the HTTP APIs: cache_salt on every route, the cached tokens in
OpenAI and Anthropic usage, the cache's counters in /metrics."""

from __future__ import annotations

import json
import urllib.request

import anthropic
import openai
import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import parse_metrics
from crucible.server.state import ServerConfig

MODEL = "tiny-random"
SYSTEM = "You are a terse assistant who answers every question in one short line. " * 3


@pytest.fixture(scope="module")
def server():
    make = lambda: build_engine(TINY_MODEL, Settings(device="cpu", weights="f32",  # noqa: E731
                                                      num_pages=256))
    with ServerThread(make, ServerConfig(model_name=MODEL)) as srv:
        yield srv


def post(srv, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_openai_usage_reports_cached_tokens_and_salts_isolate(server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]

    def cached(salt=None):
        extra = {"cache_salt": salt} if salt else {}
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3,
                                           temperature=0, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens, r.choices[0].message.content

    first, text = cached("a")
    again, text2 = cached("a")
    other, _ = cached("b")
    assert first == 0 and again > 0 and again % 16 == 0 and text2 == text
    assert other == 0  # another tenant never reads tenant a's pages
    r = client.completions.create(model=MODEL, prompt=SYSTEM, max_tokens=2, temperature=0)
    r = client.completions.create(model=MODEL, prompt=SYSTEM, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens > 0


def test_anthropic_usage_and_native_salt(server) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    kw = dict(model=MODEL, max_tokens=3, system=SYSTEM, messages=[{"role": "user",
                                                                   "content": "hi"}])
    client.messages.create(**kw)
    msg = client.messages.create(**kw)
    assert msg.usage.cache_read_input_tokens > 0
    assert msg.usage.input_tokens > msg.usage.cache_read_input_tokens
    status, body = post(server, "/generate", {"prompt": SYSTEM, "max_tokens": 2,
                                              "cache_salt": "x" * 257})
    assert status == 400 and "cache_salt" in json.dumps(body)
    status, _ = post(server, "/generate", {"prompt": SYSTEM, "max_tokens": 2,
                                           "cache_salt": "tenant"})
    assert status == 200


def test_metrics_expose_the_cache(server) -> None:
    post(server, "/generate", {"prompt": SYSTEM + " again", "max_tokens": 2})
    post(server, "/generate", {"prompt": SYSTEM + " again", "max_tokens": 2})
    with urllib.request.urlopen(server.url + "/metrics") as r:
        m = parse_metrics(r.read().decode())
    assert m["crucible_prefix_cache_hits_total"] >= 1
    assert m["crucible_prefix_cache_hit_tokens_total"] >= 16
    assert m["crucible_prefix_cache_pages"] >= 1
    cfg = server.state.engine_loop.engine.runner.config
    per_page = 2 * cfg.n_layers * 16 * cfg.kv_dim * 4
    assert m["crucible_prefix_cache_resident_bytes"] == m["crucible_prefix_cache_pages"] * per_page
    for key in ("queries_total", "admissions_total", "evictions_total"):
        assert f"crucible_prefix_cache_{key}" in m
