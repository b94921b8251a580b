"""Faults over real HTTP (tiny random model): a step that raises fails the in-flight
requests with 500 and the server keeps serving; a failure that loses pages turns /health to
503."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import openai
import pytest

from crucible.server.probe import wait_idle
from overload_server import MODEL, metrics, start


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
