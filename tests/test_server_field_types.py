"""Every field of every generation route with a value of the wrong type or range (tiny
random model, real HTTP, streamed and not): the answer is a 200 or a 4xx in the route's
own error shape naming a field, never a 5xx, and after each route every page is back in
the pool and the server still serves (tests/hostile_client.py's ``pages_back``)."""

from __future__ import annotations

import json

import pytest

from hostile_client import CHAT, MODEL, assert_serving, call, error_of
from hostile_client import server  # noqa: F401

BODIES = {
    "/generate": {"prompt": "hi", "max_tokens": 3, "temperature": 0.5, "top_p": 0.9,
                  "top_k": 5, "stop": ["x"], "seed": 1, "logprobs": 2},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 3, "temperature": 0.5,
                        "top_p": 0.9, "stop": ["x"], "seed": 1, "logprobs": 2, "n": 2,
                        "echo": False, "presence_penalty": 0.1, "logit_bias": {},
                        "stream_options": {"include_usage": True}, "user": "u"},
    "/v1/chat/completions": {"model": MODEL, "messages": CHAT, "max_tokens": 3,
                             "max_completion_tokens": 3, "temperature": 0.5, "stop": "x",
                             "seed": 1, "logprobs": True, "top_logprobs": 2, "n": 2,
                             "response_format": {"type": "text"}, "tool_choice": "none"},
    "/v1/messages": {"model": MODEL, "messages": CHAT, "max_tokens": 3, "temperature": 0.5,
                     "top_p": 0.9, "top_k": 4, "stop_sequences": ["x"], "system": "be brief",
                     "metadata": {"user_id": "a"}},
}
# Wrong types, out-of-range numbers, and shapes a field of another type would take.
VALUES = [None, -1, 0, 10**30, -10**30, 1.5, 1e308, "", "x", [], [1], ["a", 1], {},
          {"a": 1}, True, [{"role": "user"}], [{"role": "bogus", "content": "x"}],
          [{"role": "user", "content": [{"type": "image", "x": 1}]}]]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
def test_wrong_field_values_are_4xx_never_5xx(server, path, stream):  # noqa: F811
    base, answered = BODIES[path] | {"stream": stream}, {200: 0, 400: 0}
    assert call(server.url + path, base)[0] == 200  # every field as given is fine
    for field in base:
        for value in VALUES:
            body = dict(base) | {field: value}
            status, _, text = call(server.url + path, body)
            assert status < 500, (field, value, status, text[:300])
            if status == 200 and body["stream"] is True:  # server-sent events
                assert "server_error" not in text and "api_error" not in text, (field, value)
            elif status == 200:
                assert json.loads(text), (field, value)
            else:
                message, _ = error_of(path, status, text)
                assert message, (field, value)
            answered[200 if status == 200 else 400] += 1
    # The sweep meets both kinds: some values are fine (None leaves the default), most not.
    assert answered[200] > 0 and answered[400] > len(base) * 5, answered
    assert_serving(server)
