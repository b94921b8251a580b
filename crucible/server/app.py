"""The aiohttp application: routes of every API plus the middleware they share.

Middleware order (outermost first): access log -> errors -> request id -> API key ->
readiness. The access log is outermost so it sees the status the client gets. Every
failure becomes a response in the calling API's own error shape (errors.py); nothing a
client sends can take the process down. /health and /metrics are open (no API key) so
probes and scrapers work; everything else needs the key when one is configured.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Awaitable, Callable

from aiohttp import web

from crucible.server import anthropic_api, native, openai_chat, openai_common, \
    openai_completions
from crucible.server.errors import (RETRY_AFTER_S, ApiError, api_flavor, error_response,
                                    from_exception)
from crucible.server.state import (ACCESS, REQUEST_ID, STATE, RequestTokens, ServerState,
                                   hex_id)

log = logging.getLogger("crucible.server")
access_log = logging.getLogger("crucible.server.access")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = ("/health", "/metrics")
_REJECT_CAUSE = {400: "invalid", 401: "unauthorized", 404: "not_found", 405: "invalid",
                 408: "timeout", 413: "too_large", 429: "queue_full", 503: "unavailable"}


def _logged_path(request: web.Request) -> str:
    """The path as sent (percent-encoded, no query), printable ASCII, at most 200 chars:
    a client cannot break or forge log lines through it."""
    raw = request.rel_url.raw_path
    safe = raw.encode("ascii", "backslashreplace").decode("ascii")
    safe = "".join(c if " " < c < "\x7f" else f"\\x{ord(c):02x}" for c in safe)
    return safe if len(safe) <= 200 else safe[:200] + "..."


@web.middleware
async def access_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One info line per request: method, path, status, prompt/output tokens, ms, id.

    ``status -`` means no response was completed (the client went away mid-request)."""
    t0 = time.perf_counter()
    tokens = RequestTokens()
    ctx = ACCESS.set(tokens)
    status = "-"
    try:
        resp = await handler(request)
        status = str(resp.status)
        return resp
    finally:
        ACCESS.reset(ctx)
        if access_log.isEnabledFor(logging.INFO):
            toks = ("" if tokens.prompt is None else
                    f" prompt_tokens={tokens.prompt} output_tokens={tokens.output}")
            access_log.info("%s %s %s%s %.1f ms id=%s", request.method, _logged_path(request),
                            status, toks, (time.perf_counter() - t0) * 1000,
                            request.get(REQUEST_ID, "-"))


@web.middleware
async def errors_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    flavor = api_flavor(request.path)
    state: ServerState = request.app[STATE]
    try:
        return await handler(request)
    except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, too large
        if exc.status < 400:
            raise
        err = ApiError(exc.status, exc.reason if exc.status != 404 else
                       f"no route for {request.method} {request.path}")
    except ApiError as exc:
        err = exc
    except (ConnectionResetError, TimeoutError):
        raise  # the client went away; the handler's finally already aborted its request
    except Exception as exc:
        rid = request.get(REQUEST_ID) or f"req_{hex_id()}"
        log.exception("unhandled error in %s %s (request id %s)", request.method,
                      request.path, rid)
        err = from_exception(exc, rid)
    if err.status in _REJECT_CAUSE:
        state.metrics.reject(_REJECT_CAUSE[err.status])
    hdrs = {"request-id": request.get(REQUEST_ID, "")} if flavor == "anthropic" else {}
    return error_response(err, flavor, hdrs)


@web.middleware
async def request_id_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    request[REQUEST_ID] = f"req_{hex_id()}"
    return await handler(request)


@web.middleware
async def auth_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[STATE].config.api_key
    if key and request.path not in _OPEN_PATHS and not _key_matches(request, key):
        raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer "
                            "<key>' or 'x-api-key: <key>')", code="invalid_api_key")
    return await handler(request)


def _key_matches(request: web.Request, key: str) -> bool:
    """The Bearer token (scheme in any case, RFC 7235) or else x-api-key equals ``key``.

    Header values arrive decoded with surrogateescape, so bytes that are not UTF-8 become
    lone surrogates: such a key is simply wrong (401), never an encoding error (500).
    """
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else request.headers.get(
        "x-api-key", "")
    try:
        given_b = given.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given_b, key.encode("utf-8"))


@web.middleware
async def ready_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    if request.path not in _OPEN_PATHS and not state.ready:
        raise ApiError(503, f"the server is not ready: {state.health()[1]}",
                       retry_after=RETRY_AFTER_S if state.loading else None)
    return await handler(request)


def build_app(state: ServerState) -> web.Application:
    # Bodies are read by fields.read_body, which enforces --max-body-bytes itself (413 in
    # the API's shape); aiohttp's own limit stays as a backstop.
    app = web.Application(middlewares=[access_mw, errors_mw, request_id_mw, auth_mw,
                                                ready_mw],
                          client_max_size=state.config.max_body_bytes + 1)
    app[STATE] = state
    for module in (native, openai_common, openai_completions, openai_chat, anthropic_api):
        app.add_routes(module.routes)
    return app
