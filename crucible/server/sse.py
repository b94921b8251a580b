"""Server-sent events: open a stream, write ``data:`` (and optional ``event:``) frames.

Headers go out with the first frame so a client sees 200 only once the request was accepted
(a 429/400 is still a plain JSON error). Writes to a closed connection raise, and the
handler's ``finally`` aborts the request; aiohttp also cancels the handler on disconnect
(``handler_cancellation=True``), which covers the wait between tokens.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


async def open_sse(request: web.Request, headers: dict[str, str] | None = None
                   ) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # proxies must not hold tokens back
        **(headers or {})})
    await resp.prepare(request)
    return resp


async def send(resp: web.StreamResponse, data: Any, event: str | None = None) -> None:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
    await resp.write(frame.encode("utf-8"))


async def close(resp: web.StreamResponse) -> None:
    await resp.write_eof()
