"""Hostile input over real HTTP on loopback (tiny random model): bodies and headers
that do not decode (lone surrogates, deep nesting, false gzip, non-UTF-8 keys) and the
error bodies of protocol errors and 500s.

Every probe of the hostile-input pass is a 4xx (or a closed connection) in the API's own error
shape, never a 500, a stall of /health or a held-open socket; after each the server still
serves and every page is back in the pool (tests/hostile_client.py)."""

from __future__ import annotations

import json

import pytest

from hostile_client import (CHAT, MODEL, assert_serving, call, error_of, metrics, post_bytes,
                            raw)
from hostile_client import keyed, pages_back, server  # noqa: F401


# -- 1. 500s that were 4xx ------------------------------------------------------------------------

SURROGATE = "\\ud800"  # the six characters of the JSON escape, not a Python surrogate
TEXT_ROUTES = {
    "/generate": ('{"prompt": "%s", "max_tokens": 2}', "prompt"),
    "/tokenize": ('{"prompt": "%s"}', "prompt"),
    "/v1/completions": ('{"model": "tiny-random", "prompt": "%s", "max_tokens": 2}', "prompt"),
    "/v1/chat/completions": ('{"model": "tiny-random", "max_tokens": 2, "messages": '
                             '[{"role": "user", "content": "%s"}]}', "messages"),
    "/v1/messages": ('{"model": "tiny-random", "max_tokens": 2, "messages": '
                     '[{"role": "user", "content": "%s"}]}', "messages"),
    "/v1/messages/count_tokens": ('{"model": "tiny-random", "messages": '
                                  '[{"role": "user", "content": "a%sb"}]}', "messages"),
}


@pytest.mark.parametrize("path", list(TEXT_ROUTES) + ["/v1/messages system"])
def test_lone_surrogate_is_a_400_naming_the_field(server, path):
    if path == "/v1/messages system":
        path, field = "/v1/messages", "system"
        body = ('{"model": "tiny-random", "max_tokens": 2, "system": "x%s", '
                '"messages": [{"role": "user", "content": "hi"}]}') % SURROGATE
    else:
        template, field = TEXT_ROUTES[path]
        body = template % SURROGATE
    status, _, text = call(server.url + path, body.encode())
    assert status == 400, text
    message, param = error_of(path, status, text)
    assert field in message and "surrogate" in message
    assert param in (None, field)
    # a proper pair is fine
    status, _, text = call(server.url + path, body.replace(SURROGATE, "\\ud83d\\ude00").encode())
    assert status == 200, text
    assert_serving(server)


JSON_ROUTES = list(TEXT_ROUTES) + ["/detokenize"]


@pytest.mark.parametrize("path", JSON_ROUTES)
@pytest.mark.parametrize("depth", [100_000, 200])
def test_deeply_nested_json_is_a_400(server, path, depth):
    body = ('{"prompt": ' + "[" * depth + "]" * depth + "}").encode()
    status, _, text = call(server.url + path, body)
    assert status == 400, text
    message, _ = error_of(path, status, text)
    assert "nested too deeply" in message
    assert_serving(server)


@pytest.mark.parametrize("path", ["/generate", "/v1/messages"])
def test_content_encoding_gzip_that_is_not_gzip_is_a_400(server, path):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    status, headers, out = raw(server, post_bytes(path, body, b"Content-Encoding: gzip\r\n"))
    assert status == 400, out
    message, _ = error_of(path, status, out.decode())
    assert "gzip" in message and "Content-Encoding" in message
    assert headers["content-type"].startswith("application/json")
    assert_serving(server)


@pytest.mark.parametrize("header", [b"x-api-key: \xff\xfe\x80", b"Authorization: Bearer \xff\xc3(",
                                    b"Authorization: \xe9t\xe9"])
def test_non_utf8_api_key_is_a_401(keyed, header):
    before = metrics(keyed).get('crucible_requests_rejected_total{cause="unauthorized"}', 0)
    body = json.dumps({"model": MODEL, "max_tokens": 2, "messages": CHAT}).encode()
    for path in ("/v1/chat/completions", "/v1/messages"):
        status, _, out = raw(keyed, post_bytes(path, body, header + b"\r\n"))
        assert status == 401, out
        message, _ = error_of(path, status, out.decode())
        assert "API key" in message
    after = metrics(keyed)['crucible_requests_rejected_total{cause="unauthorized"}']
    assert after == before + 2
    assert metrics(keyed).get('crucible_requests_rejected_total{cause="internal"}', 0) == 0


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_bearer_scheme_in_any_case_is_accepted(keyed, scheme):
    status, _, text = call(keyed.url + "/generate", {"prompt": "hi", "max_tokens": 2},
                           {"Authorization": f"{scheme} sekret"})
    assert status == 200, text
    status, _, text = call(keyed.url + "/generate", {"prompt": "hi", "max_tokens": 2},
                           {"Authorization": f"{scheme} wrong"})
    assert status == 401 and error_of("/generate", status, text)[1] is None


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/messages"])
def test_protocol_errors_are_json_without_echo(server, path):
    for head in (b"Content-Length: 12abc<script>\r\n", b"Bad\x01Header<script>: 1\r\n",
                 b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"):
        data = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + head
                + b"Connection: close\r\n\r\nhello")
        status, headers, out = raw(server, data)
        assert status == 400, out
        assert headers["content-type"].startswith("application/json")
        assert b"<script>" not in out and b"abc" not in out
        message, _ = error_of(path, status, out.decode())
        assert message.startswith("malformed HTTP request")
    assert_serving(server)


def test_500_bodies_name_no_internal_exception(server):
    async def broken(*a, **k):
        raise ValueError("secret internal detail")

    server.state.encode = broken
    try:
        for path, body in (("/generate", {"prompt": "hi"}),
                           ("/v1/messages", {"model": MODEL, "max_tokens": 2,
                                             "messages": CHAT})):
            status, headers, text = call(server.url + path, body)
            assert status == 500, text
            assert "ValueError" not in text and "secret" not in text
            message, _ = error_of(path, 400, text) if path.startswith("/v1/messages") else (
                json.loads(text)["error"]["message"], None)
            assert "internal error" in message and "req_" in message
    finally:
        del server.state.encode
    assert_serving(server)
