"""One internal error type for the HTTP layer, rendered in each API's own shape.

Handlers raise ``ApiError`` (or let engine errors propagate); the app's middleware turns
it into a response whose body matches the API the client called:
- OpenAI:    ``{"error": {"message", "type", "param", "code"}}``
- Anthropic: ``{"type": "error", "error": {"type", "message"}}``
- native:    the OpenAI shape (vLLM's native server uses it too, so clients need one parser).
Overload is 429 + Retry-After for OpenAI/native and 529 ``overloaded_error`` for
Anthropic, which is what Anthropic's own API (and its SDK's ``OverloadedError``) use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from crucible.errors import QueueFullError, RequestError
from crucible.server.stream import EngineGone

RETRY_AFTER_S = 1  # a full queue usually drains within a few steps; ask for a short wait

# OpenAI error "type" by status (as the OpenAI API names them).
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 404: "not_found_error", 405: "invalid_request_error",
                 408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_exceeded",
                 500: "server_error", 503: "service_unavailable"}
# Anthropic error "type" by status (from Anthropic's documented error list).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    404: "not_found_error", 405: "invalid_request_error",
                    408: "invalid_request_error",
                    413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    503: "overloaded_error", 529: "overloaded_error"}


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None  # seconds, sent as Retry-After (429 always has one)

    def __str__(self) -> str:
        return self.message


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def from_exception(exc: BaseException, request_id: str | None = None) -> ApiError:
    """Map an engine-side exception to the status the client should see.

    A 500 never names the exception (its class and text are internals, logged instead); it
    says "internal error" and gives the request id to find the log line by."""
    if isinstance(exc, ApiError):
        return exc
    cause = getattr(exc, "cause", None)  # EngineFailure: the worker's refusal, if it was one
    if isinstance(cause, (QueueFullError, RequestError, EngineGone)):
        exc = cause
    if isinstance(exc, QueueFullError):
        return ApiError(429, str(exc), code="queue_full")
    if isinstance(exc, RequestError):
        return ApiError(400, str(exc))
    if isinstance(exc, EngineGone):  # our own words ("exited with code -9"), no internals
        rid = f" (request id {request_id})" if request_id else ""
        return ApiError(500, f"{exc}; this request did not finish{rid}", code="engine_exited")
    return internal_error(request_id, "the engine failed while running this request",
                          "engine_failure")


def internal_error(request_id: str | None, what: str = "the server failed",
                   code: str = "internal_error") -> ApiError:
    rid = f" (request id {request_id})" if request_id else ""
    return ApiError(500, f"internal error: {what}{rid}; the server log has the details",
                    code=code)


def api_flavor(path: str) -> str:
    """Which API's error shape a path answers in: 'anthropic', 'openai' or 'native'."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    return "native"


def error_body(err: ApiError, flavor: str) -> dict:
    if flavor == "anthropic":
        status = 529 if err.status == 429 else err.status
        return {"type": "error",
                "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                          "message": err.message}}
    return {"error": {"message": err.message,
                      "type": _OPENAI_TYPES.get(err.status, "server_error"),
                      "param": err.param, "code": err.code}}


def error_response(err: ApiError, flavor: str, headers: dict[str, str] | None = None
                   ) -> web.Response:
    status = err.status
    hdrs = dict(headers or {})
    if status == 429 or err.retry_after is not None:
        hdrs["Retry-After"] = str(err.retry_after or RETRY_AFTER_S)
        if flavor == "anthropic":
            status = 529  # Anthropic's "overloaded" status; the SDK raises OverloadedError
    return web.Response(status=status, text=json.dumps(error_body(err, flavor)),
                        content_type="application/json", headers=hdrs)
