"""The engine process's life seen over HTTP: 503 + Retry-After while it loads, a load
failure reported in its own words, a failed step failing only its requests (and a leaking
one turning /health to 503), a killed process failing every live request (stream and not)
and /health naming its exit code, a disconnect freeing the pages in the process, and no
engine process left behind by a shutdown or by a killed front."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from crucible.engine.factory import TINY_MODEL
from crucible.engine.settings import Settings
from crucible.server.engine_client import EngineProcessConfig
from crucible.server.launch import ServerThread
from engine_process_kit import engine_pid, gone, wait_for

SETTINGS = Settings(device="cpu", weights="f32", num_pages=256)
REPO = Path(__file__).resolve().parent.parent
LONG = {"prompt": "the cat", "max_tokens": 1500, "ignore_eos": True}


def call(url: str, body: dict | None = None, timeout: float = 15) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_loading_answers_503_with_retry_after_then_serves(tmp_path):
    gate = tmp_path / "go"
    srv = ServerThread(EngineProcessConfig(str(gate), SETTINGS, "engine_process_kit:gated"))
    srv.start(wait_loaded=False)
    try:
        status, headers, body = call(srv.url + "/health")
        assert status == 503 and body["detail"] == "loading" and headers["Retry-After"] == "1"
        status, headers, body = call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and "loading" in body["error"]["message"]
        assert headers["Retry-After"] == "1"
        assert call(srv.url + "/v1/models")[0] == 503
        gate.touch()
        wait_for(lambda: call(srv.url + "/health")[0] == 200, 30)
        # Ready, before any step: /metrics already shows the pool (it came with the ready).
        with urllib.request.urlopen(srv.url + "/metrics", timeout=15) as r:
            text = r.read().decode()
        assert "crucible_pages_total 256\n" in text
        status, _, body = call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 2})
        assert status == 200 and body["usage"]["completion_tokens"] == 2
    finally:
        gate.touch()
        srv.stop()


@pytest.mark.parametrize("model, factory, words", [
    ("missing.gguf", None, "missing.gguf"),
    (TINY_MODEL, "engine_process_kit:broken", "ZeroDivisionError: the factory divided by zero"),
])
def test_a_load_failure_is_reported_in_its_own_words(tmp_path, model, factory, words):
    spec = str(tmp_path / model) if model.endswith(".gguf") else model
    cfg = EngineProcessConfig(spec, SETTINGS, **({"factory": factory} if factory else {}))
    srv = ServerThread(cfg)
    try:
        with pytest.raises(RuntimeError, match=words.split(":")[0]):
            srv.start()
        status, _, body = call(srv.url + "/health")
        assert status == 503 and "failed to load" in body["detail"] and words in body["detail"]
        status, _, body = call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and words in body["error"]["message"]
        assert gone(engine_pid(srv))
    finally:
        srv.stop()


def test_a_killed_engine_fails_live_requests_and_health():
    srv = ServerThread(EngineProcessConfig(TINY_MODEL, SETTINGS, "engine_process_kit:slow_steps"))
    srv.start()
    results: dict[str, object] = {}

    def non_stream() -> None:
        results["plain"] = call(srv.url + "/generate", LONG, timeout=30)

    def stream() -> None:
        req = urllib.request.Request(srv.url + "/generate",
                                     data=json.dumps({**LONG, "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            results["stream"] = r.read().decode()

    threads = [threading.Thread(target=f, daemon=True) for f in (non_stream, stream)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: srv.engine_stats()["running"] == 2)
        pid = engine_pid(srv)
        os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(20)
            assert not t.is_alive(), "a request hangs after the engine process died"
        words = "the engine process exited with code -9"
        status, _, body = results["plain"]  # type: ignore[misc]
        assert status == 500 and words in body["error"]["message"], body
        frames = [f for f in results["stream"].split("\n\n") if f]  # type: ignore[union-attr]
        assert words in frames[-2] and frames[-1] == "data: [DONE]", frames[-3:]
        status, _, body = call(srv.url + "/health")
        assert status == 503 and words in body["detail"]
        status, _, body = call(srv.url + "/v1/completions",
                               {"model": "crucible", "prompt": "x", "max_tokens": 2})
        assert status == 503 and words in body["error"]["message"]
        assert gone(pid)
    finally:
        t0 = time.monotonic()
        srv.stop()
        assert time.monotonic() - t0 < 10


def test_a_failed_step_fails_its_requests_and_a_leak_turns_health_503(tmp_path):
    gate = tmp_path / "fault"
    srv = ServerThread(EngineProcessConfig(str(gate), SETTINGS, "engine_process_kit:faulty"))
    srv.start()
    try:
        gate.write_text("fail")
        status, _, body = call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 3})
        assert status == 500 and "internal error" in body["error"]["message"]
        assert "injected" not in body["error"]["message"]
        gate.unlink()  # the engine process serves on, and every page came back
        assert call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 3})[0] == 200
        assert call(srv.url + "/health")[0] == 200
        gate.write_text("leak")
        assert call(srv.url + "/generate", {"prompt": "hi", "max_tokens": 3})[0] == 500
        status, _, body = call(srv.url + "/health")
        assert status == 503 and "unaccounted for" in body["detail"]
        assert srv.state.metrics.finished["error"] == 2
    finally:
        srv.stop()


def test_a_disconnect_frees_the_pages_in_the_engine_process():
    srv = ServerThread(EngineProcessConfig(TINY_MODEL, SETTINGS, "engine_process_kit:slow_steps"))
    srv.start()
    try:
        before = srv.engine_stats()["tokens_generated"]

        async def hang_up() -> None:
            async with aiohttp.ClientSession() as s:
                async with s.post(srv.url + "/generate", json={**LONG, "stream": True}) as r:
                    for _ in range(3):
                        await r.content.readuntil(b"\n\n")
                    assert srv.engine_stats()["pages_free"] < SETTINGS.num_pages

        asyncio.run(hang_up())

        def idle() -> bool:
            st = srv.engine_stats()
            return st["running"] == 0 and st["pages_free"] == st["pages_total"]

        wait_for(idle, 5)
        assert srv.engine_stats()["tokens_generated"] - before < 200  # it stopped at once
    finally:
        srv.stop()


def test_shutdown_ends_live_requests_and_leaves_no_engine_process():
    srv = ServerThread(EngineProcessConfig(TINY_MODEL, SETTINGS, "engine_process_kit:slow_steps"))
    srv.start()
    pid = engine_pid(srv)
    done = threading.Event()

    def stream() -> None:
        req = urllib.request.Request(srv.url + "/generate",
                                     data=json.dumps({**LONG, "stream": True}).encode())
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
        except (urllib.error.URLError, ConnectionError, OSError):
            pass  # the server closed it: what matters is that it ended
        done.set()

    threading.Thread(target=stream, daemon=True).start()
    wait_for(lambda: srv.engine_stats()["running"] == 1)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 10 and done.wait(10)
    assert gone(pid, 1.0)


def _spawn(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _child_pid(proc: subprocess.Popen, marker: str) -> int:
    for line in proc.stdout:  # type: ignore[union-attr]
        if marker in line:
            return int(line.rsplit(marker, 1)[1].split()[0])
    raise AssertionError(f"{marker!r} never printed (exit {proc.wait()})")


@pytest.mark.parametrize("loading", [False, True])
def test_a_killed_front_leaves_no_engine_process(tmp_path, loading):
    """Killed idle, the engine process sees its pipe's EOF; killed while it loads, its
    parent watch notices."""
    gate = tmp_path / ("never" if loading else "open")
    if not loading:
        gate.touch()
    proc = _spawn(
        "import time\n"
        "from crucible.engine.settings import Settings\n"
        "from crucible.server.engine_client import EngineProcessConfig\n"
        "from crucible.server.launch import ServerThread\n"
        "if __name__ == '__main__':\n"
        f"    srv = ServerThread(EngineProcessConfig({str(gate)!r}, Settings(device='cpu',"
        " weights='f32', num_pages=64), 'engine_process_kit:gated'))\n"
        f"    srv.start(wait_loaded={not loading})\n"
        "    while not getattr(srv.state.engine_loop or srv.state.starting, 'pid', None):\n"
        "        time.sleep(0.01)\n"
        "    print('engine pid', (srv.state.engine_loop or srv.state.starting).pid, flush=True)\n"
        "    time.sleep(60)\n")
    try:
        pid = _child_pid(proc, "engine pid ")
        assert not gone(pid, 0.3)
        proc.kill()
        proc.wait(10)
        assert gone(pid, 5.0), "the engine process outlived its front"
    finally:
        proc.kill()
        proc.wait(10)
