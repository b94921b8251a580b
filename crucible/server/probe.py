"""Reading a running server from outside: Prometheus text parsing and idle/page checks.

Used by the load generator (queue peak, pages in use) and by the tests, which assert after
every workload that the server went idle with every page back in the pool.
"""

from __future__ import annotations

import re
import time
from typing import Any

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def parse_metrics(text: str) -> dict[str, float]:
    """``{"name" or "name{labels}": value}`` for every sample line."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def engine_idle(engine: Any) -> bool:
    """No live request and every page free (read from another thread: a snapshot)."""
    alloc = engine.allocator
    return not engine.has_unfinished() and alloc.num_free == alloc.num_pages


def wait_idle(engine: Any, timeout: float = 20.0) -> bool:
    """Poll until ``engine_idle``; False if it never happens within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_idle(engine):
            return True
        time.sleep(0.01)
    return engine_idle(engine)
