"""Hostile input over real HTTP on loopback (tiny random model): every probe of the hostile-
input pass is a 4xx (or a closed connection) in the API's own error shape, never a 500, a
stall of /health or a held-open socket; after each the server still serves and every page
is back in the pool."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import parse_metrics, wait_idle
from crucible.server.state import ServerConfig, encode_releasing_gil

MODEL = "tiny-random"
CHAT = [{"role": "user", "content": "hi"}]


def make_server(max_queue: int = 64, **cfg) -> ServerThread:
    settings = Settings(device="cpu", weights="f32", num_pages=256, max_queue=max_queue)
    srv = ServerThread(lambda: build_engine(TINY_MODEL, settings),
                       ServerConfig(model_name=MODEL, max_queue=max_queue, **cfg)).start()
    srv.engine = srv.state.engine_loop.engine
    return srv


@pytest.fixture(scope="module")
def server():
    srv = make_server(read_timeout=1.0, max_body_bytes=3 << 20)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keyed():
    srv = make_server(api_key="sekret")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def limited():
    srv = make_server(max_queue=4, max_connections=20, read_timeout=2.0,
                      max_response_entries=1000)
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def pages_back(request):
    yield
    for name in ("server", "keyed", "limited"):
        if name in request.fixturenames:
            srv = request.getfixturevalue(name)
            assert wait_idle(srv.engine), f"{name}: pages did not come back"
            alloc = srv.engine.allocator
            assert alloc.num_free == alloc.num_pages


def call(url: str, body: object | bytes | None = None, headers: dict | None = None,
         timeout: float = 30) -> tuple[int, dict, str]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def metrics(srv) -> dict[str, float]:
    return parse_metrics(call(srv.url + "/metrics")[2])


def error_of(path: str, status: int, text: str) -> tuple[str, str | None]:
    """(message, param) of an error body, checking the route's own shape."""
    body = json.loads(text)
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        return body["error"]["message"], None
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["type"] != "server_error", body
    return body["error"]["message"], body["error"]["param"]


def assert_serving(srv) -> None:
    status, _, text = call(srv.url + "/health")
    assert status == 200, text
    status, _, text = call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 2})
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 2, text


# -- raw sockets ------------------------------------------------------------------------------

async def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """Send ``data`` as is; read the response to EOF (Connection: close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def raw(srv, data: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    return asyncio.run(raw_exchange(srv.port, data, timeout))


def post_bytes(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def closed_within(reader: asyncio.StreamReader, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closed the connection (EOF) and what it sent first."""
    t0 = time.monotonic()
    data = await asyncio.wait_for(reader.read(), limit)
    return time.monotonic() - t0, data


async def health_ms(port: int) -> float:
    t0 = time.monotonic()
    status, _, _ = await raw_exchange(
        port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5)
    assert status == 200
    return (time.monotonic() - t0) * 1e3


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


def test_two_megabyte_prompt_is_refused_while_health_answers(server):
    body = json.dumps({"model": MODEL, "prompt": "the quick brown fox " * 100_000}).encode()
    assert len(body) > 2_000_000
    status, times = asyncio.run(_big_prompt_with_health(server.port, body))
    assert status == 400
    assert max(times) < 100, times
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
        for add_bos in (None, False, True):
            assert encode_releasing_gil(tok, text, add_bos) == tok.encode(text, add_bos=add_bos)
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


# -- 6. incomplete requests --------------------------------------------------------------------

async def _trickle(port: int) -> tuple[float, bytes, list[float]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    healths: list[float] = []
    t0 = time.monotonic()
    try:
        for byte in request:  # bounded: at most 100-odd bytes, 0.2 s apart
            if reader.at_eof() or time.monotonic() - t0 > 5:
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            healths.append(await health_ms(port))
            await asyncio.sleep(0.2)
            if reader._buffer or reader.at_eof():  # type: ignore[attr-defined]
                break
        data = await asyncio.wait_for(reader.read(), 5)
    except ConnectionError:
        data = b""
    finally:
        writer.close()
    return time.monotonic() - t0, data, healths


def test_trickled_headers_are_closed_within_the_read_timeout(server):
    elapsed, data, healths = asyncio.run(_trickle(server.port))
    assert elapsed < 2.0, elapsed  # read_timeout 1 s
    assert not data.startswith(b"HTTP/1.1 200")
    assert healths and max(healths) < 500
    assert_serving(server)


async def _short_body(port: int, data: bytes) -> tuple[float, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        task = asyncio.create_task(closed_within(reader, 5))
        await asyncio.sleep(0.3)
        assert await health_ms(port) < 500
        return await task
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/generate", "/v1/messages"])
@pytest.mark.parametrize("kind", ["content-length", "chunked"])
def test_incomplete_bodies_get_408_and_are_closed(server, path, kind):
    if kind == "content-length":
        data = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                b"Content-Type: application/json\r\n\r\n{\"prompt\": ")
    else:
        data = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                b"chunked\r\nContent-Type: application/json\r\n\r\n5\r\n{\"pro\r\n")
    elapsed, out = asyncio.run(_short_body(server.port, data))
    assert elapsed < 2.0, elapsed
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), out
    message, _ = error_of(path, 408, body.decode())
    assert "--read-timeout" in message
    assert_serving(server)


async def _idle_flood(port: int, count: int) -> tuple[list[float], int]:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    try:
        await asyncio.sleep(0.1)
        times = [await health_ms(port) for _ in range(5)]
        closed = 0
        for reader, _ in conns:
            try:
                await asyncio.wait_for(reader.read(), 0.05)
                closed += 1  # EOF: evicted (or refused at once)
            except asyncio.TimeoutError:
                pass
            except ConnectionError:
                closed += 1
        return times, closed
    finally:
        for _, w in conns:
            w.close()


def test_idle_connections_over_the_limit_do_not_stop_health(limited):
    times, closed = asyncio.run(_idle_flood(limited.port, 30))
    assert max(times) < 500, times
    assert closed >= 10  # 30 idle + the probes against 20: the oldest idle ones went first
    assert_serving(limited)


async def _busy_flood(port: int, count: int) -> tuple[int, dict, bytes, float]:
    data = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    conns = []
    for _ in range(count):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(data)
        await w.drain()
        conns.append((r, w))
    try:
        await asyncio.sleep(0.2)  # every one is inside a request, waiting for its body
        t0 = time.monotonic()
        status, headers, body = await raw_exchange(
            port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5)
        return status, headers, body, time.monotonic() - t0
    finally:
        for _, w in conns:
            w.close()


def test_busy_connections_over_the_limit_refuse_with_503(limited):
    status, headers, body, elapsed = asyncio.run(_busy_flood(limited.port, 20))
    assert status == 503 and elapsed < 1.0
    assert headers["retry-after"] == "1"
    assert "too many connections" in json.loads(body)["error"]["message"]
    deadline = time.monotonic() + 10
    while call(limited.url + "/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_serving(limited)
