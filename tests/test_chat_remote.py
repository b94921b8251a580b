"""``llm-engine chat --url`` against a real server (in this process, the engine in a worker
thread as with --engine-in-process): the model name from /v1/models, a reply decoded in the
same packed steps as an independent HTTP client's stream, Ctrl-C closing the stream so the
server aborts it, every page free afterwards (engine stats and /metrics), the API key."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pexpect
import pytest

from crucible.engine.factory import build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.state import ServerConfig
from engine_process_kit import wait_idle
from test_chat_support import TIMEOUT_S, say, send, spawn_chat, stop, wait_prompt

KEY = "chat-test-key"
REPLY = "1500"  # tokens: about a second of decoding alone


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chat-remote")


@pytest.fixture(scope="module")
def server(root: Path):
    from test_chat_support import chat_model

    settings = Settings(device="cpu", weights="int8", cpu_threads=1)
    srv = ServerThread(lambda: build_engine(str(chat_model(root)), settings),
                       ServerConfig(model_name="tiny-served", api_key=KEY)).start()
    try:
        yield srv
    finally:
        srv.stop()


def pages_used_metric(srv: ServerThread) -> int:
    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return int(float(re.search(r"^crucible_pages_used (\S+)$", text, re.M).group(1)))


class Neighbour(threading.Thread):
    """Another client: one long streamed chat completion, read until told to hang up."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        body = {"model": "tiny-served", "messages": [{"role": "user", "content": "go on"}],
                "stream": True, "max_tokens": 20000, "temperature": 0}
        self.request = urllib.request.Request(
            url + "/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        self.started = threading.Event()
        self.hang_up = threading.Event()
        self.pieces = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with urllib.request.urlopen(self.request, timeout=30) as resp:
                for line in resp:
                    if line.startswith(b"data: {"):
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        if delta.get("content"):
                            self.pieces += 1
                            self.started.set()
                    if self.hang_up.is_set():
                        return
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_remote_chat_shares_the_batch_cancels_and_frees_pages(root: Path, server) -> None:
    child = spawn_chat(root, "--url", server.url + "/v1", "--api-key", KEY,
                       "--max-tokens", REPLY, local=False)
    banner = wait_prompt(child)
    assert f"model tiny-served | server {server.url} | max-tokens {REPLY}" in banner
    neighbour = Neighbour(server.url)
    neighbour.start()
    assert neighbour.started.wait(TIMEOUT_S), neighbour.error
    # The chat's reply runs while the neighbour streams: both in the engine at once.
    send(child, "hello from the terminal")
    child.expect_exact("assistant> ")
    together = 0
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        together = max(together, server.engine_stats()["running"])
        # Keep reading the pty, so the chat never blocks on a full terminal buffer.
        if child.expect_exact([f"[cut at max-tokens {REPLY}]", pexpect.TIMEOUT],
                              timeout=0.02) == 0:
            break
        assert time.monotonic() < deadline, "the reply did not end"
    assert together == 2, "the chat's request never ran beside the other client's"
    wait_prompt(child)
    assert f"last reply: {REPLY} tokens (length)" in say(child, "/stats")
    assert neighbour.is_alive() and neighbour.error is None
    neighbour.hang_up.set()
    neighbour.join(TIMEOUT_S)
    wait_idle(server)

    # Ctrl-C mid-reply closes the stream; the server aborts the request.
    generated = server.engine_stats()["tokens_generated"]
    send(child, "and another")
    child.expect("assistant> .")  # the reply has started streaming
    child.sendintr()
    child.expect(r"\[cancelled after (\d+) tokens; this turn is not kept\]")
    assert int(child.match.group(1)) < int(REPLY)
    wait_prompt(child)
    st = wait_idle(server)
    assert st["pages_free"] == st["pages_total"]
    # Aborted, not run to its end: the engine made about what the chat showed.
    assert st["tokens_generated"] - generated < int(REPLY) // 2
    deadline = time.monotonic() + 10
    while pages_used_metric(server) != 0:
        assert time.monotonic() < deadline, "/metrics still counts used pages"
        time.sleep(0.05)
    # ...and the chat goes on, on the server.
    assert f"[cut at max-tokens {REPLY}]" in say(child, "one more")
    assert "4 messages kept" in say(child, "/stats")  # the first exchange and this one
    assert stop(child) == 0
    wait_idle(server)


def test_remote_chat_without_the_key_is_one_clear_error(root: Path, server) -> None:
    child = spawn_chat(root, "--url", server.url, local=False)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2
    assert "the server answered 401" in child.before and "pass --api-key" in child.before
    assert "Traceback" not in child.before


def test_remote_chat_waits_for_a_loading_server(root: Path) -> None:
    """503 + Retry-After from /v1/models while the model loads: the chat waits, then talks."""
    from test_chat_support import chat_env, chat_model

    model = chat_model(root)
    settings = Settings(device="cpu", weights="int8", cpu_threads=1)

    def slow_build():
        time.sleep(1.5)
        return build_engine(str(model), settings)

    srv = ServerThread(slow_build, ServerConfig(model_name="late")).start(wait_loaded=False)
    try:
        out = subprocess.run([sys.executable, "-m", "crucible", "chat", "--url", srv.url,
                              "--max-tokens", "3", "--temperature", "0"], input="hello\n",
                             capture_output=True, text=True, env=chat_env(root),
                             timeout=TIMEOUT_S)
    finally:
        srv.stop()
    assert out.returncode == 0, out.stderr
    assert f"{srv.url} is loading its model; waiting" in out.stderr
    assert "model late" in out.stderr and "[cut at max-tokens 3]" in out.stdout
