"""Strict reading of JSON request bodies: every wrong type or value is a 400 naming the field.

Python's ``bool`` is an ``int``; JSON ``true`` must never pass as ``max_tokens: 1``, so
integer fields reject bools explicitly. Floats accept ints (``"temperature": 1``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from aiohttp import web

from crucible.server.errors import bad_request

MAX_BODY_BYTES = 8 << 20

_MISSING = object()


async def read_json(request: web.Request) -> "Body":
    raw = await request.read()
    if not raw:
        raise bad_request("the request body is empty; a JSON object is required")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    return Body(data)


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

    def stop_list(self, name: str, max_items: int | None = None) -> tuple[str, ...]:
        """A stop field: one string or a list of non-empty strings."""
        v = self.data.get(name)
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
            raise bad_request(f"'{name}' must be a non-empty string or a list of them", name)
        if max_items is not None and len(items) > max_items:
            raise bad_request(f"'{name}' takes at most {max_items} strings, got {len(items)}",
                              name)
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
