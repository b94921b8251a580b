"""The streaming fast road of crucible/server/sse.py, without a server: ``Frame`` gives the
bytes ``json.dumps`` gives, and ``relay`` writes what the handler would have written frame
by frame (one HTTP chunk per frame, in arrival order), whether a delta goes out from the
call that delivers it or after queueing, and ends with the first failure."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from crucible.engine.engine import RequestDelta
from crucible.engine.sampling import SamplingParams
from crucible.server import sse
from crucible.server.stream import EngineFailure, RequestStream

TRICKY = ['a', '"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "€", "😀", "\u2028",
          "/", " ", "</script>", "\ud7ff"]


def test_frame_bytes_are_json_dumps_bytes() -> None:
    rng = random.Random(0)

    def chunk(i: int, text: str, reason: str | None) -> dict:
        return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": 'm"é',
                "choices": [{"index": i, "text": text, "logprobs": None,
                             "finish_reason": reason}], "usage": None}

    f = sse.Frame(chunk(3, sse.hole(0), sse.hole(1)))
    g = sse.Frame({"text": sse.hole(0), "token_ids": sse.hole(1), "finish_reason": sse.hole(2)},
                  "ev")
    for _ in range(5000):
        text = "".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 6)))
        reason = rng.choice([None, "stop", "length", "abort"])
        ids = [rng.randint(0, 1 << 20) for _ in range(rng.randint(0, 3))]
        assert f.render(sse.json_str(text), sse.reason_json(reason)) == \
            sse.frame(chunk(3, text, reason))
        assert g.render(sse.json_str(text), "[" + ", ".join(map(str, ids)) + "]",
                        sse.reason_json(reason)) == \
            sse.frame({"text": text, "token_ids": ids, "finish_reason": reason}, "ev")


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def _relay_setup():
    transport = _Transport()
    writer = SimpleNamespace(transport=transport, chunked=True, buffer_size=0, output_size=0)

    async def drain() -> None:
        writer.buffer_size = 0

    writer.drain = drain
    request = SimpleNamespace(writer=writer)
    resp = SimpleNamespace(compression=False)
    streams = [RequestStream(f"r{i}", [1], SamplingParams()) for i in range(2)]
    return transport, writer, request, resp, streams


def _delta(rid: str, text: str, finished: bool = False) -> RequestDelta:
    return RequestDelta(rid, (7,), text, None, None, finished, "length" if finished else None, 0)


def _frames_of(i: int, d: RequestDelta) -> list[bytes]:
    return [f"data: {i}{d.new_text}{'!' if d.finished else ''}\n\n".encode()]


def _chunked(*frames: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(f), f) for f in frames)


def test_relay_writes_each_frame_as_its_own_chunk_in_arrival_order() -> None:
    async def run() -> None:
        transport, writer, request, resp, (a, b) = _relay_setup()
        a.put(_delta("r0", "x"), 0.0)  # queued before relay starts
        task = asyncio.create_task(sse.relay(request, resp, [a, b], _frames_of))
        await asyncio.sleep(0)
        assert transport.writes == [_chunked(b"data: 0x\n\n")]
        b.put(_delta("r1", "y"), 0.1)  # the handler waits: written by the delivering call
        assert transport.writes[-1] == _chunked(b"data: 1y\n\n")
        writer.buffer_size = 1 << 20  # a slow reader: deliveries queue for the handler
        a.put(_delta("r0", "z"), 0.2)
        b.put(_delta("r1", "w", finished=True), 0.2)
        assert len(transport.writes) == 2
        await asyncio.sleep(0)
        # the backlog in one write, one chunk per frame: the bytes of one write per frame
        assert transport.writes[-1] == _chunked(b"data: 0z\n\n", b"data: 1w!\n\n")
        assert writer.buffer_size == 0  # drained, as aiohttp drains past 64 KiB
        a.put(_delta("r0", "v", finished=True), 0.3)
        await asyncio.wait_for(task, 1)
        assert transport.writes[-1] == _chunked(b"data: 0v!\n\n")
        assert writer.output_size == sum(len(w) for w in transport.writes)

    asyncio.run(run())


def test_relay_ends_with_the_failure_after_the_frames_before_it() -> None:
    async def run() -> None:
        transport, writer, request, resp, (a, b) = _relay_setup()
        task = asyncio.create_task(sse.relay(request, resp, [a, b], _frames_of))
        await asyncio.sleep(0)
        writer.buffer_size = 1 << 20
        a.put(_delta("r0", "x"), 0.0)
        b.fail(EngineFailure("boom"))
        with pytest.raises(EngineFailure, match="boom"):
            await asyncio.wait_for(task, 1)
        assert transport.writes == [_chunked(b"data: 0x\n\n")]

    asyncio.run(run())


def test_relay_raises_on_a_closing_transport() -> None:
    async def run() -> None:
        transport, writer, request, resp, (a, _) = _relay_setup()
        task = asyncio.create_task(sse.relay(request, resp, [a], _frames_of))
        await asyncio.sleep(0)
        transport.closing = True  # the client went away: the handler's own write raises
        a.put(_delta("r0", "x"), 0.0)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(task, 1)
        assert transport.writes == []

    asyncio.run(run())


def test_a_write_that_raises_never_reaches_the_delivering_call() -> None:
    """The delivery goes on to other clients' streams: a transport write that raises there
    leaves the delta to the handler, whose own write raises it."""
    async def run() -> None:
        transport, writer, request, resp, (a, _) = _relay_setup()

        def broken(data: bytes) -> None:
            raise RuntimeError("the transport broke")

        task = asyncio.create_task(sse.relay(request, resp, [a], _frames_of))
        await asyncio.sleep(0)
        transport.write = broken
        a.put(_delta("r0", "x"), 0.0)  # must not raise here
        with pytest.raises(RuntimeError, match="broke"):
            await asyncio.wait_for(task, 1)
        assert writer.output_size == 0

    asyncio.run(run())
