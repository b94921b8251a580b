"""The hostile-input tests' servers and clients (tests/test_server_hostile_*.py): three
module-scoped servers (``server``, ``keyed`` with an API key, ``limited`` with small bounds),
the autouse check that every page is back after each test, and urllib / raw-socket clients
with the API's error shapes."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import parse_metrics, wait_idle
from crucible.server.state import ServerConfig

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
