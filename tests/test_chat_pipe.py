"""``llm-engine chat`` with stdin from a pipe (plain reads, no prompt_toolkit): line by
line, a trailing backslash continuing a message, the commands, /reset without a question,
the end of input ending the chat with a newline; and the --url flag's refusals."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_chat_support import TIMEOUT_S, chat_env, chat_model


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chat-pipe")


def chat(root: Path, stdin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crucible", "chat", "--temperature", "0",
                           *args], input=stdin, capture_output=True, text=True,
                          env=chat_env(root), timeout=TIMEOUT_S)


def test_piped_input_line_by_line(root: Path) -> None:
    saved = root / "piped.json"
    script = ("hello\n"
              "a message \\\n"  # continues on the next line
              "on two lines\n"
              "/system be kind\n"
              "/stats\n"
              "/reset\n"  # no one to ask: it resets at once
              "/bogus\n"
              "after the reset\n"
              f"/save {saved}\n")  # then end of input, no empty line
    out = chat(root, script, "--model", str(chat_model(root)), "--device", "cpu",
               "--max-tokens", "4", "--stats")
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n") and not out.stdout.endswith("\n\n")
    assert out.stdout.count("assistant> ") == 3
    # eight reads and the one that met the end of input
    assert out.stdout.count("you> ") == 9 and out.stdout.count("...  ") == 1
    assert out.stdout.count("[cut at max-tokens 4]") == 3
    assert "[conversation reset (the system prompt is kept)]" in out.stdout
    assert "last reply: 4 tokens (length)" in out.stdout
    # The banner, stats lines and errors go to stderr: stdout holds only the chat.
    assert "Crucible chat | model tiny-chat" not in out.stdout
    assert "Crucible chat | model tiny-chat | device cpu" in out.stderr
    assert out.stderr.count("[prompt ") == 3
    assert "unknown command '/bogus'" in out.stderr
    doc = json.loads(saved.read_text())
    assert doc["messages"][:2] == [{"role": "system", "content": "be kind"},
                                   {"role": "user", "content": "after the reset"}]
    assert len(doc["messages"]) == 3
    # the two-line message was one turn: the second prompt is longer than the first
    lens = [int(line.split()[1]) for line in out.stderr.splitlines()
            if line.startswith("[prompt")]
    assert lens[1] > lens[0] + len("a message on two lines") // 2


def test_exit_ends_a_piped_chat_with_a_newline(root: Path) -> None:
    out = chat(root, "/exit\nnever read\n", "--model", str(chat_model(root)), "--device",
               "cpu", "--max-tokens", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "you> \n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args,message", [
    (["--url", "http://127.0.0.1:1", "--model", "x"], "--model does not apply with --url"),
    (["--url", "http://127.0.0.1:1", "--num-pages", "8"], "--num-pages does not apply"),
    (["--api-key", "k"], "--api-key needs --url"),
    (["--url", "127.0.0.1:8000"], "--url must start with http:// or https://"),
])
def test_url_flag_refusals(root: Path, args: list[str], message: str) -> None:
    out = chat(root, "", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_server_is_one_clear_error(root: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    out = chat(root, "hello\n", "--url", url)
    assert out.returncode == 2
    assert f"llm-engine: error: cannot reach {url}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
