"""Server-sent events: open a stream, write ``data:`` (and optional ``event:``) frames.

Headers go out with the first frame so a client sees 200 only once the request was accepted
(a 429/400 is still a plain JSON error). Writes to a closed connection raise, and the
handler's ``finally`` aborts the request; aiohttp also cancels the handler on disconnect
(``handler_cancellation=True``), which covers the wait between tokens.

The token frames of a stream take a faster road, because at tens of thousands of tokens a
second the front has a few tens of microseconds per token for everything:
- ``Frame``: a frame's JSON encoded once per response with holes, so a token costs one
  string escape (``json_str``, the escape ``json.dumps`` itself uses) and a join instead
  of building and encoding a dict; the bytes are exactly ``json.dumps``'s.
- ``relay``: the deltas of a response's engine requests are formatted and written by the
  call that delivers them while the handler waits (stream.Outbox.direct), one transport
  write per delivery; what queued up meanwhile (the handler was busy, or the client reads
  slowly) goes out in one write, still as one HTTP chunk per frame, so the bytes on the wire
  are those of one ``write`` per frame. It drains as aiohttp does (over 64 KiB written since
  the last drain) and raises on a closing transport as aiohttp does.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring as json_str  # json.dumps' own (C) string escape
from typing import Any, Callable, Sequence

from aiohttp import web

from crucible.engine.engine import RequestDelta
from crucible.server.stream import EngineFailure, RequestStream, shared_outbox

__all__ = ["Frame", "close", "frame", "hole", "json_str", "open_sse", "reason_json", "relay",
           "send"]
_DRAIN_BYTES = 0x10000  # aiohttp's own threshold (StreamWriter.write's LIMIT)
_REASONS = {None: "null", "stop": '"stop"', "length": '"length"'}


async def open_sse(request: web.Request, headers: dict[str, str] | None = None
                   ) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # proxies must not hold tokens back
        **(headers or {})})
    await resp.prepare(request)
    return resp


def frame(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return ((f"event: {event}\n" if event else "") + f"data: {payload}\n\n").encode("utf-8")


async def send(resp: web.StreamResponse, data: Any, event: str | None = None) -> None:
    await resp.write(frame(data, event))


async def close(resp: web.StreamResponse, data: Any = None, event: str | None = None) -> None:
    """End the stream, after a last frame when given: aiohttp writes that frame's chunk and
    the chunked body's end in one write, the bytes of ``send`` then ``close``."""
    await resp.write_eof(b"" if data is None else frame(data, event))


def reason_json(reason: str | None) -> str:
    """The JSON of a finish reason (a ``Frame`` hole)."""
    return _REASONS.get(reason) or json.dumps(reason)


def hole(k: int) -> str:
    """A placeholder value for ``Frame``: where the k-th JSON fragment goes."""
    return f"\x00crucible-hole-{k}\x00"


class Frame:
    """The bytes ``send(resp, data, event)`` writes, with holes filled per token.

    ``data`` holds ``hole(0)``, ``hole(1)``... as values; ``render`` takes the JSON text of
    each (``json_str(text)``, ``"null"``, ``"[1, 2]"``) in that order."""

    __slots__ = ("parts",)

    def __init__(self, data: dict, event: str | None = None) -> None:
        text = ((f"event: {event}\n" if event else "") + "data: "
                + json.dumps(data, ensure_ascii=False) + "\n\n")
        parts, k = [], 0
        while (marker := json.dumps(hole(k))) in text:
            head, text = text.split(marker)  # exactly once, or this raises
            parts.append(head)
            k += 1
        self.parts = (*parts, text)

    def render(self, *values: str) -> bytes:
        p = self.parts
        if len(values) == 1:
            return (p[0] + values[0] + p[1]).encode("utf-8")
        out = [p[0]]
        for v, tail in zip(values, p[1:]):
            out += (v, tail)
        return "".join(out).encode("utf-8")


class _Writer:
    """Frames straight to the response's transport, framed as aiohttp frames them."""

    __slots__ = ("w", "t", "chunked")

    def __init__(self, request: web.Request, transport: Any) -> None:
        self.w = request.writer  # the StreamWriter resp writes through (headers are out)
        # The connection's transport for the whole response: once the client is gone it
        # says is_closing(), as aiohttp's own check reads it.
        self.t = transport
        self.chunked = self.w.chunked  # HTTP/1.1, no length (resp.chunked: only if asked)

    def offer(self, frames: Sequence[bytes]) -> bool:
        """Write now unless the transport closes or a drain is due (False: not written).

        Called from the engine's delivery, which goes on to other clients' streams: a
        write that raises is left to the handler's own write, which raises it there."""
        if self.w.buffer_size > _DRAIN_BYTES or self.t.is_closing():
            return False
        try:
            self._put(frames)
        except Exception:  # noqa: BLE001 - nothing was written; the handler's write reports it
            return False
        return True

    def write(self, frames: Sequence[bytes]) -> None:
        if self.t.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        self._put(frames)

    def _put(self, frames: Sequence[bytes]) -> None:
        if not self.chunked:
            data = b"".join(frames)
        elif len(frames) == 1:  # what StreamWriter._write_chunked_payload sends for each
            data = b"%x\r\n%b\r\n" % (len(frames[0]), frames[0])
        else:
            data = b"".join([b"%x\r\n%b\r\n" % (len(f), f) for f in frames])
        self.t.write(data)  # first: a write that raises leaves the counts as they were
        w = self.w
        w.buffer_size += len(data)
        w.output_size += len(data)

    async def send(self, frames: Sequence[bytes]) -> None:
        if frames:
            self.write(frames)
        if self.w.buffer_size > _DRAIN_BYTES:
            self.w.buffer_size = 0
            await self.w.drain()


async def relay(request: web.Request, resp: web.StreamResponse,
                streams: list[RequestStream],
                frames_of: Callable[[int, RequestDelta], list[bytes]]) -> None:
    """Send every delta of ``streams`` as the frames ``frames_of(index, delta)`` gives, until
    each stream finished; raises the first ``EngineFailure`` after the frames before it.

    ``frames_of`` must be pure: a delta it raises on in the direct path is formatted again,
    and raises, on the handler's own path."""
    transport = request.writer.transport
    # Compressed (never asked for here) or already gone: aiohttp's own writes, which raise.
    out = None if resp.compression or transport is None else _Writer(request, transport)
    box, left = shared_outbox(streams), len(streams)

    def direct(i: int, d: RequestDelta) -> bool:
        # A finished delta wakes the handler (it ends the response); so does a closing or
        # full transport, which the handler's own write reports or drains.
        if d.finished or out is None:
            return False
        try:
            frames = frames_of(i, d)
        except Exception:  # noqa: BLE001 - raised again where the handler sees it
            return False
        return out.offer(frames) if frames else True

    box.direct = direct
    try:
        while left:
            frames: list[bytes] = []
            for i, item in await box.take():
                if isinstance(item, EngineFailure):
                    await _send(resp, out, frames)
                    raise item
                frames += frames_of(i, item)
                if item.finished:
                    left -= 1
            await _send(resp, out, frames)
    finally:
        box.direct = None


async def _send(resp: web.StreamResponse, out: _Writer | None, frames: list[bytes]) -> None:
    if out is not None:
        await out.send(frames)
        return
    for f in frames:
        await resp.write(f)
