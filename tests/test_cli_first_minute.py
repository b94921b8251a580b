"""The CLI's first minute: a missing GPU is one line before anything listens, flag errors
are one line plus a pointer, every --help shows its defaults, a one-token run has no decode
rate, and the README's CLI section lists every flag."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from crucible.cli import main
from crucible.cli_args import DefaultsFormatter
from crucible.chat.main import chat_parser
from crucible.cli_generate import generate_parser, stats_line
from crucible.cli_serve import parser as serve_parser

REPO = Path(__file__).resolve().parent.parent
PARSERS = {"generate": generate_parser, "chat": chat_parser, "serve": serve_parser}


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "crucible", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_serve_cuda_without_gpu_is_one_line_before_listening() -> None:
    from crucible.backend.select import cuda_backend_available, gpu_available

    if cuda_backend_available() and gpu_available():
        pytest.skip("a GPU is present here")
    t0 = time.monotonic()
    out = run_cli("serve", "--device", "cuda", "--port", "0")
    assert time.monotonic() - t0 < 30
    assert out.returncode == 2
    text = (out.stdout + out.stderr).strip()
    assert len(text.splitlines()) == 1, text
    assert text.startswith("llm-engine serve: error: --device cuda")
    assert "listening" not in text and "Traceback" not in text


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_flag_errors_are_one_line_with_a_pointer(command, capsys) -> None:
    args = [command, "--max-tokens" if command != "serve" else "--max-queue", "0"]
    if command == "generate":
        args += ["--prompt", "x"]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    flag = args[1]
    assert err == (f"llm-engine {command}: error: argument {flag}: must be >= 1, got 0 "
                   f"(see llm-engine {command} --help)\n")


def test_unknown_flag_is_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--frobnicate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--frobnicate" in err and "(see llm-engine serve --help)" in err


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_with_a_value_shows_its_default(command) -> None:
    p = PARSERS[command]()
    fmt = DefaultsFormatter(p.prog)
    for action in p._actions:
        if not action.option_strings or action.nargs == 0 or action.required:
            continue
        text = fmt._get_help_string(action)
        assert "(default" in text, f"{command} {action.option_strings[0]}: {text!r}"
        assert text.count("(default:") == 1, text
    help_text = " ".join(p.format_help().split())
    assert "(default: none)" in help_text or command == "serve"
    if command == "serve":
        for flag, shown in (("--host", "127.0.0.1"), ("--port", "8000"), ("--max-queue", "64"),
                            ("--seed", "0"), ("--log-level", "info"),
                            ("--token-budget", "1024")):
            assert flag in help_text and f"(default: {shown})" in help_text, flag
        assert "the API is open (default: none)" in help_text  # --api-key


def _stats(n_out: int, rate: float | None) -> str:
    engine = SimpleNamespace(runner=SimpleNamespace(device="cpu",
                                                    model=SimpleNamespace(weights_mode="f32")))
    return stats_line({"prompt_tokens": 3, "generated_tokens": n_out, "ttft_s": 0.01,
                       "decode_tok_s": rate, "finish_reason": "length"}, engine)


def test_stats_line_has_no_decode_rate_for_one_token() -> None:
    assert "| decode - tok/s |" in _stats(1, None)
    assert "| decode 55.3 tok/s |" in _stats(12, 55.3)


def test_generate_one_token_prints_no_decode_rate(tmp_path) -> None:
    from crucible.model.tiny import save_hf_dir, tiny_random_model

    save_hf_dir(tiny_random_model(seed=0), tmp_path / "tiny")
    out = run_cli("generate", "--prompt", "the cat", "--max-tokens", "1", "--temperature", "0",
                  "--device", "cpu", "--weights", "f32", "--model", str(tmp_path / "tiny"))
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stderr.splitlines() if x.startswith("[prompt")]
    assert len(line) == 1 and "generated 1 tok" in line[0], out.stderr
    assert "| decode - tok/s |" in line[0] and "0.0 tok/s" not in line[0]


def _readme_cli_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## The CLI")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_readme_lists_every_flag(command) -> None:
    section = _readme_cli_section()
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", section))
    p: argparse.ArgumentParser = PARSERS[command]()
    for action in p._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                assert opt in flags, f"README's CLI section does not list {command} {opt}"
