"""The overload tests' servers (tests/test_server_overload.py, test_server_disconnect.py,
test_server_faults.py): a tiny-random server with small bounds (``start``; the module-scoped
``server``), its metrics, a streaming request that holds nearly every page, and a wait."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import aiohttp
import pytest

from crucible.engine.factory import build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import parse_metrics
from crucible.server.state import ServerConfig

MODEL = "tiny-random"
BLOCKER_PROMPT = [65] * 1900  # 119 of 128 pages: nothing of 10+ pages can be admitted
BURST_PROMPT = [66] * 150  # its first slice needs 10 pages


def start(max_queue: int = 64, num_pages: int = 256, token_budget: int = 1024,
          step_delay: float = 0.0, **cfg) -> ServerThread:
    settings = Settings(device="cpu", weights="f32", num_pages=num_pages,
                        token_budget=token_budget, max_queue=max_queue)

    def make():
        engine, info = build_engine(MODEL, settings)
        if step_delay:  # a slower engine widens the window in which the pool stays full
            forward = engine.runner.forward
            engine.runner.forward = lambda b: (time.sleep(step_delay), forward(b))[1]
        return engine, info

    srv = ServerThread(make, ServerConfig(model_name=MODEL, max_queue=max_queue, **cfg)).start()
    srv.engine = srv.state.engine_loop.engine
    return srv


def metrics(srv) -> dict[str, float]:
    with urllib.request.urlopen(srv.url + "/metrics") as r:
        return parse_metrics(r.read().decode())


async def open_blocker(session: aiohttp.ClientSession, srv) -> aiohttp.ClientResponse:
    """Stream a request that holds nearly every page; return once it is decoding."""
    resp = await session.post(srv.url + "/generate", json={
        "prompt_token_ids": BLOCKER_PROMPT, "max_tokens": 147, "ignore_eos": True,
        "stream": True})
    assert resp.status == 200
    await resp.content.readuntil(b"\n\n")  # the first token: prefill is done
    return resp


async def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def server():
    srv = start(num_pages=256)
    yield srv
    srv.stop()
