"""Helpers for the chat tests (no tests here): a tiny model with room for long replies,
and ``llm-engine chat`` spawned on a pseudo-terminal.

The tiny random model decodes thousands of tokens a second on a CPU, so a reply that is to
be cancelled or resized mid-stream is given thousands of tokens to write: its context is
32k positions, and greedy decoding of seed 0 does not sample its end-of-turn token early
for the prompts these tests send.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pexpect

_MODEL_DIR: Path | None = None
PROMPT = "you>"  # prompt_toolkit draws the prompt's trailing space as a cursor move
TIMEOUT_S = 15


def chat_model(tmp_root: Path) -> Path:
    """An HF directory of the tiny random model with a 32k context (written once)."""
    global _MODEL_DIR
    if _MODEL_DIR is None or not _MODEL_DIR.is_dir():
        from crucible.model.tiny import save_hf_dir, tiny_random_model

        _MODEL_DIR = tmp_root / "tiny-chat"
        save_hf_dir(tiny_random_model(seed=0, max_context=32768), _MODEL_DIR)
    return _MODEL_DIR


def chat_env(tmp_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CRUCIBLE_CPU_THREADS="1", CRUCIBLE_CACHE=str(tmp_root / "cache"),
               PROMPT_TOOLKIT_NO_CPR="1",  # a pexpect pty never answers cursor queries
               TERM="xterm", PYTHONIOENCODING="utf-8")
    return env


def spawn_chat(tmp_root: Path, *args: str, local: bool = True) -> pexpect.spawn:
    """``llm-engine chat ARGS`` on a 24x80 pty; ``local`` adds the tiny model on the CPU."""
    argv = ["-m", "crucible", "chat", "--temperature", "0", *args]
    if local:
        argv += ["--model", str(chat_model(tmp_root)), "--device", "cpu"]
    child = pexpect.spawn(sys.executable, argv, env=chat_env(tmp_root), encoding="utf-8",
                          codec_errors="replace", timeout=TIMEOUT_S, dimensions=(24, 80))
    child.logfile_read = open(tmp_root / f"pty-{child.pid}.log", "w", encoding="utf-8")
    return child


# prompt_toolkit turns bracketed paste on when it starts reading and off when the input is
# accepted: between the two marks lies only what the chat itself wrote.
READING, ACCEPTED = "\x1b[?2004h", "\x1b[?2004l"


def wait_prompt(child: pexpect.spawn) -> str:
    """The chat's output up to the next prompt."""
    child.expect_exact(READING)
    out = child.before
    child.expect_exact(PROMPT)
    return out


def send(child: pexpect.spawn, keys: str) -> None:
    """Type ``keys`` and Enter; return once the input is accepted."""
    child.send(keys + "\r")
    child.expect_exact(ACCEPTED)


def say(child: pexpect.spawn, text: str) -> str:
    """Send a line at the prompt; return the output up to the next prompt."""
    send(child, text)
    return wait_prompt(child)


def stop(child: pexpect.spawn) -> int:
    """End the chat with Ctrl-D; return its exit status."""
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus
