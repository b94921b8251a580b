"""Strict reading of JSON request bodies: every wrong type or value is a 400 naming the field.

Python's ``bool`` is an ``int``; JSON ``true`` must never pass as ``max_tokens: 1``, so
integer fields reject bools explicitly. Floats accept ints (``"temperature": 1``).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any, Iterable

from aiohttp import web
from aiohttp.http_exceptions import (ContentEncodingError, ContentLengthError,
                                     HttpProcessingError, TransferEncodingError)

from crucible.server.errors import ApiError, bad_request
from crucible.server.state import MAX_BODY_BYTES, READ_TIMEOUT_S, STATE

MAX_JSON_DEPTH = 64  # nesting of arrays/objects; every real body needs under 10
MAX_STOP = 16  # stop strings per request (native, Anthropic); OpenAI keeps its own 4
MAX_STOP_CHARS = 256  # characters per stop string
MAX_STOP_TOKEN_IDS = 64

_MISSING = object()
# A \uD800-\uDFFF escape: the only way JSON text can carry a (possibly lone) surrogate once
# the body is strict UTF-8. Cheap to look for; the walk below runs only when it matches.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


async def read_body(request: web.Request, limit: int = MAX_BODY_BYTES,
                    timeout: float = READ_TIMEOUT_S) -> bytes:
    """The body, at most ``limit`` bytes (after Content-Encoding), each chunk within ``timeout``.

    A body that stops arriving (a Content-Length larger than what is sent, an unterminated
    chunked body) is a 408 after ``timeout`` seconds of silence, and the connection closes.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        raise ApiError(413, f"the request body has {declared} bytes, more than the limit of "
                            f"{limit} bytes (--max-body-bytes)", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(timeout):
                chunk = await request.content.readany()
        except TimeoutError:
            no_linger(request)
            raise ApiError(408, f"the request body stopped arriving: nothing for {timeout:g} s "
                                f"(--read-timeout)", code="body_timeout") from None
        except (HttpProcessingError, web.RequestPayloadError) as exc:
            no_linger(request)
            raise bad_request(f"the request body could not be read: {_body_problem(exc)}"
                              ) from None
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is larger than the limit of {limit} bytes "
                                f"(--max-body-bytes)", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def no_linger(request: web.Request) -> None:
    """Close this connection right after the error response instead of draining the body."""
    stop = getattr(request.protocol, "stop_lingering", None)
    if stop is not None:
        stop()


def _body_problem(exc: Exception) -> str:
    """What is wrong with the body's framing, in words (never the client's bytes)."""
    if isinstance(exc.__cause__, HttpProcessingError):
        exc = exc.__cause__  # aiohttp wraps parser errors in RequestPayloadError
    text = str(exc).lower()
    if isinstance(exc, ContentEncodingError) or "content-encoding" in text:
        enc = "".join(c for c in text.rpartition(":")[2] if c.isalnum() or c in "-_")
        return f"it is not valid {enc[:20] or 'compressed'} data (Content-Encoding)"
    if isinstance(exc, TransferEncodingError):
        return "malformed chunked transfer encoding"
    if isinstance(exc, ContentLengthError):
        return "it is shorter than its Content-Length"
    return "malformed body framing"


async def read_json(request: web.Request) -> "Body":
    cfg = request.app[STATE].config
    raw = await read_body(request, cfg.max_body_bytes, cfg.read_timeout)
    if not raw:
        raise bad_request("the request body is empty; a JSON object is required")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                          f"column {exc.colno}") from None
    except RecursionError:
        raise bad_request(f"the request body is nested too deeply (at most {MAX_JSON_DEPTH} "
                          f"levels of arrays/objects)") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(raw):
        _check_tree(data)
    return Body(data)


def _check_tree(data: dict) -> None:
    """Depth at most MAX_JSON_DEPTH and no lone surrogates in any string (iteratively)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            if not _valid_unicode(v):
                name = path or "body"
                raise bad_request(f"'{name}' contains a lone UTF-16 surrogate (an unpaired "
                                  f"\\ud800-\\udfff escape), which is not valid Unicode",
                                  _top(path))
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise bad_request(f"the request body is nested too deeply (at most "
                              f"{MAX_JSON_DEPTH} levels of arrays/objects)", _top(path) or None)
        if isinstance(v, dict):
            for k, item in v.items():
                key = k if _valid_unicode(k) else "?"
                sub = f"{path}.{key}" if path else key
                if key == "?":
                    raise bad_request(f"a field name in '{path or 'body'}' contains a lone "
                                      f"UTF-16 surrogate", _top(path) or None)
                stack.append((item, sub, depth + 1))
        else:
            for i, item in enumerate(v):
                if isinstance(item, (str, dict, list)):
                    stack.append((item, f"{path}[{i}]", depth + 1))


def _valid_unicode(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _top(path: str) -> str | None:
    return re.split(r"[.\[]", path, maxsplit=1)[0] or None


class Body:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __contains__(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str, default: Any = None) -> Any:
        v = self.data.get(name)
        return default if v is None else v

    def reject_unknown(self, allowed: Iterable[str]) -> None:
        extra = sorted(set(self.data) - set(allowed))
        if extra:
            raise bad_request(f"unknown field(s): {', '.join(extra)}", param=extra[0])

    def int(self, name: str, default: Any = _MISSING, *, lo: int | None = None,
            hi: int | None = None) -> Any:
        v = self.data.get(name)
        if v is None:
            return self._default(name, default)
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)  # 16.0 is a fine 16; 16.5 is not
            else:
                raise bad_request(f"'{name}' must be an integer, got {json.dumps(v)}", name)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise bad_request(f"'{name}' must be {_range(lo, hi)}, got {v}", name)
        return v

    def float(self, name: str, default: Any = _MISSING, *, lo: float | None = None,
              hi: float | None = None, lo_open: bool = False) -> Any:
        v = self.data.get(name)
        if v is None:
            return self._default(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad_request(f"'{name}' must be a finite number, got {json.dumps(v)}", name)
        v = float(v)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise bad_request(f"'{name}' must be {'>' if lo_open else '>='} {lo}, got {v}", name)
        if hi is not None and v > hi:
            raise bad_request(f"'{name}' must be <= {hi}, got {v}", name)
        return v

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        v = self.data.get(name)
        if v is None:
            return self._default(name, default)
        if not isinstance(v, bool):
            raise bad_request(f"'{name}' must be true or false, got {json.dumps(v)}", name)
        return v

    def str(self, name: str, default: Any = _MISSING) -> Any:
        v = self.data.get(name)
        if v is None:
            return self._default(name, default)
        if not isinstance(v, str):
            raise bad_request(f"'{name}' must be a string, got {json.dumps(v)[:80]}", name)
        return v

    def stop_list(self, name: str, max_items: int = MAX_STOP,
                  max_chars: int = MAX_STOP_CHARS) -> tuple[str, ...]:
        """A stop field: one string or a list of at most ``max_items`` non-empty strings of at
        most ``max_chars`` characters each (every stop string is checked at every step)."""
        v = self.data.get(name)
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list):
            raise bad_request(f"'{name}' must be a non-empty string or a list of them", name)
        if len(items) > max_items:
            raise bad_request(f"'{name}' takes at most {max_items} strings, got {len(items)}",
                              name)
        if not all(isinstance(s, str) and s for s in items):
            raise bad_request(f"'{name}' must be a non-empty string or a list of them", name)
        longest = max(len(s) for s in items) if items else 0
        if longest > max_chars:
            raise bad_request(f"each of '{name}' may have at most {max_chars} characters, got "
                              f"one of {longest}", name)
        return tuple(items)

    def dict(self, name: str) -> dict[str, Any]:
        v = self.data.get(name)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise bad_request(f"'{name}' must be an object, got {json.dumps(v)[:80]}", name)
        return v

    def _default(self, name: str, default: Any) -> Any:
        if default is _MISSING:
            raise bad_request(f"'{name}' is required", name)
        return default


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"


def token_id_list(v: Any, name: str) -> list[int] | None:
    """``v`` as a list of token ids, or None if it is not a list of ints at all."""
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in v):
        return list(v)
    return None
