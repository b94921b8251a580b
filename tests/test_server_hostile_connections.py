"""Hostile input over real HTTP on loopback (tiny random model): connections that
trickle, stop short or flood (read timeouts, incomplete bodies, idle and busy connections
over the limit).

Every probe of the hostile-input pass is a 4xx (or a closed connection) in the API's own error
shape, never a 500, a stall of /health or a held-open socket; after each the server still
serves and every page is back in the pool (tests/hostile_client.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from hostile_client import (assert_serving, call, closed_within, error_of, health_ms,
                            raw_exchange)
from hostile_client import limited, pages_back, server  # noqa: F401


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
