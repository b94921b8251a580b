"""The HTTP connection layer under the app: timeouts, a connection limit, JSON protocol errors.

aiohttp's ``RequestHandler`` (one per connection) is subclassed so that:
- a request whose headers do not all arrive within ``--read-timeout`` (a client trickling a
  byte at a time, or one that connects and sends nothing) is closed: aiohttp's keep-alive
  timer, started when the connection opens and after every response, closes a connection
  still waiting for a complete request line + headers; it runs with
  ``keepalive_timeout = read_timeout``. Bodies are timed by fields.read_body (408);
- at most ``--max-connections`` connections are open: a new one beyond the limit first
  evicts the longest-open idle connection (one not in the middle of a request: idle
  keep-alive or still sending headers); if every connection is busy, the newcomer gets a
  canned 503 in JSON and is closed at once. Nothing is logged per refusal;
- errors aiohttp's parser reports itself (malformed request line or headers, bad framing)
  answer JSON in the route's error shape (the path is sniffed from the request line when it
  parsed) without echoing the client's bytes, where aiohttp answers plain text with them.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import (BadHttpMessage, BadHttpMethod, BadStatusLine,
                                     ContentLengthError, InvalidHeader, LineTooLong,
                                     TransferEncodingError)
from aiohttp.web_server import Server

from crucible.server.errors import ApiError, api_flavor, error_body, internal_error
from crucible.server.state import STATE

log = logging.getLogger("crucible.server")
REFUSED_LINGER_S = 0.5
_REQUEST_LINE = re.compile(rb"[A-Z]{3,7} (/[!-~]{0,256}?)[ ?]")

_PROBLEMS = ((LineTooLong, "a request line or header is too long"),
             (InvalidHeader, "a header is malformed"),
             (BadHttpMethod, "the request line is malformed"),
             (BadStatusLine, "the request line is malformed"),
             (TransferEncodingError, "the chunked body is malformed"),
             (ContentLengthError, "the Content-Length does not match the body"),
             (BadHttpMessage, "the request is malformed"))


def _refusal(limit: int) -> bytes:
    body = json.dumps(error_body(ApiError(
        503, f"too many connections (the server holds at most {limit}, all busy); retry "
             f"later", code="too_many_connections"), "native")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body)


class CrucibleProtocol(web_protocol.RequestHandler):
    """One connection: the limit at connect time, JSON protocol errors, optional no-linger."""

    def connection_made(self, transport: Any) -> None:
        self._path = ""
        self._refused = False
        self._opened = self._loop.time()
        mgr = self._manager
        limit = getattr(mgr, "max_connections", 0)
        if limit and mgr is not None and not _make_room(mgr, limit):
            # Answer, half-close, and drop what the client sends for a moment before the
            # close (closing with unread bytes would reset the connection, losing the 503).
            self._refused = True
            self._manager = None  # never registered: connection_lost has nothing to undo
            transport.write(_refusal(limit))
            if transport.can_write_eof():
                transport.write_eof()
            self._loop.call_later(REFUSED_LINGER_S, transport.close)
            return
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._request_in_progress:
            m = _REQUEST_LINE.match(data)
            if m:
                self._path = m.group(1).decode("ascii", "replace")
        super().data_received(data)

    def idle(self) -> bool:
        """Open but not inside a request: waiting for (the rest of) the next request."""
        return not (self._request_in_progress or self._force_close or self._messages)

    def stop_lingering(self) -> None:
        """After this response close the connection instead of draining the unread body."""
        self._lingering_time = 0.0

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: too late for another response
            raise ConnectionError("response already sent; cannot send the error")
        flavor = api_flavor(self._path)
        if status >= 500:
            rid = "conn_" + format(id(self), "x")
            log.error("error handling a request to %s (%s)", self._path or "?", rid,
                      exc_info=exc)
            err = internal_error(rid)
        else:
            problem = next((text for cls, text in _PROBLEMS if isinstance(exc, cls)),
                           "the request is malformed")
            log.debug("malformed HTTP request to %s: %r", self._path or "?", exc)
            err = ApiError(status, f"malformed HTTP request: {problem}")
            _count_reject(self._manager, "invalid")
        resp = web.Response(status=err.status, text=json.dumps(error_body(err, flavor)),
                            content_type="application/json")
        resp.force_close()
        return resp


def _make_room(mgr: Any, limit: int) -> bool:
    """True if a new connection may open: under the limit, or an idle one was evicted."""
    live = [h for h in mgr._connections if not getattr(h, "_force_close", False)]
    if len(live) < limit:
        return True
    idle = [h for h in live if isinstance(h, CrucibleProtocol) and h.idle()]
    if not idle:
        _count_reject(mgr, "unavailable")
        return False
    min(idle, key=lambda h: h._opened).force_close()
    return True


def _count_reject(mgr: Any, cause: str) -> None:
    app = getattr(getattr(mgr, "request_handler", None), "__self__", None)
    try:
        app[STATE].metrics.reject(cause)  # type: ignore[index]
    except Exception:  # not our app (or gone): counting is best effort
        pass


class CrucibleServer(Server):
    max_connections = 0

    def __call__(self) -> web_protocol.RequestHandler:
        return CrucibleProtocol(self, loop=self._loop, **self._kwargs)


class CrucibleRunner(web.AppRunner):
    """An AppRunner whose connections are ``CrucibleProtocol``s under a connection limit."""

    def __init__(self, app: web.Application, *, max_connections: int, read_timeout: float,
                 **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=read_timeout,
                         lingering_time=min(read_timeout, 10.0), **kwargs)
        self._max_connections = max_connections

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = CrucibleServer  # same state, our protocol factory
        server.max_connections = self._max_connections  # type: ignore[attr-defined]
        return server
