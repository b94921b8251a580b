"""``llm-engine serve`` as a real process: starts, logs its configuration, serves, stops
cleanly on SIGINT or SIGTERM (its engine process gone too; ``--engine-in-process`` has
none); a model that cannot load exits non-zero instead of serving."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "crucible", "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("mode, sig", [("process", signal.SIGINT), ("process", signal.SIGTERM),
                                       ("in-process", signal.SIGINT)],
                         ids=["process-SIGINT", "process-SIGTERM", "in-process-SIGINT"])
def test_serve_starts_serves_and_stops_on_a_signal(mode, sig):
    port = free_port()
    proc = serve("--model", "tiny-random", "--port", str(port), "--max-queue", "3",
                 "--token-budget", "256", "--chunk-cap", "64", "--num-pages", "100",
                 "--weights", "f32", "--device", "cpu",
                 *(["--engine-in-process"] if mode == "in-process" else []))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "server never became healthy"
            time.sleep(0.1)
        body = json.dumps({"prompt": "hi", "max_tokens": 3, "ignore_eos": True}).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "/generate", data=body)) as r:
            assert json.load(r)["usage"]["completion_tokens"] == 3
        with urllib.request.urlopen(url + "/metrics") as r:
            text = r.read().decode()
        assert "crucible_queue_bound 3" in text and "crucible_pages_total 100" in text
    finally:
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    child = re.search(r"engine process (\d+)", out)
    assert (child is None) == (mode == "in-process"), out
    if child:  # the engine process was told to stop and waited for, not left behind
        assert not Path(f"/proc/{child.group(1)}").exists()
    assert "token_budget=256" in out and "chunk_cap=64" in out and "weights=f32" in out
    # one access line per request, with its tokens (the server logs at info by default)
    assert "crucible.server.access: POST /generate 200 prompt_tokens=" in out
    assert "output_tokens=3 " in out and "GET /metrics 200 " in out


def test_serve_exits_non_zero_when_the_model_cannot_load(tmp_path):
    proc = serve("--model", str(tmp_path / "missing.gguf"), "--port", str(free_port()))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "missing.gguf" in out and "Traceback" not in out


def test_serve_rejects_bad_flags():
    proc = serve("--max-queue", "0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "max-queue" in out
