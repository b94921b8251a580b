"""The llm-engine command line: bad values fail clearly; the default model says Paris."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crucible.cli import main


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crucible", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["generate", "--prompt", "x", "--max-tokens", "0"], "must be >= 1"),
    (["generate", "--prompt", "x", "--max-tokens", "ten"], "expected a whole number"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "must be >= 0"),
    (["generate", "--prompt", "x", "--temperature", "nan"], "must be finite"),
    (["generate", "--prompt", "x", "--top-p", "1.5"], "must be in (0, 1]"),
    (["generate", "--prompt", "x", "--top-k", "0"], "must be >= 1"),
    (["generate", "--prompt", "x", "--seed", "-3"], "must be >= 0"),
    (["generate", "--prompt", "x", "--device", "tpu"], "invalid choice"),
    (["generate", "--prompt", "x", "--weights", "int4"], "invalid choice"),
    (["generate"], "--prompt"),
])
def test_bad_values_exit_2_with_a_message(args, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_command_and_model() -> None:
    out = run_cli("frobnicate")
    assert out.returncode == 2 and "unknown command 'frobnicate'" in out.stderr
    out = run_cli("generate", "--prompt", "hi", "--model", "no-such-model", "--device", "cpu")
    assert out.returncode == 2 and "unknown model 'no-such-model'" in out.stderr
    assert "Traceback" not in out.stderr


def test_cuda_without_backend_fails_clearly() -> None:
    from crucible.backend.select import cuda_backend_available, gpu_available

    if cuda_backend_available() and gpu_available():
        pytest.skip("a GPU backend is present here")
    out = run_cli("generate", "--prompt", "hi", "--device", "cuda")
    assert out.returncode == 2 and "--device cuda" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.model
def test_default_model_continues_with_paris(default_model_path) -> None:
    out = run_cli("generate", "--prompt", "The capital of France is", "--max-tokens", "8",
                  "--temperature", "0", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "prompt 5 tok" in out.stderr and "generated 8 tok" in out.stderr
    assert "device cpu" in out.stderr and "weights int8" in out.stderr


def test_unknown_attention_variant_is_a_startup_error() -> None:
    import os

    env = dict(os.environ, CRUCIBLE_PREFILL_ATTN="fastest-please")
    out = subprocess.run([sys.executable, "-m", "crucible", "generate", "--prompt", "hi",
                          "--model", "no-such-model-needed", "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert "fastest-please" in out.stderr and "exact-q4-k64" in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_attention_variant_rejected_by_the_api_and_the_runner(monkeypatch) -> None:
    """On every device, not only on GPUs: the setting is checked before anything is built."""
    from crucible import LLM
    from crucible.errors import ConfigError
    from crucible.engine.runner import ModelRunner
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=0)
    with pytest.raises(ConfigError, match="exact-q4-k64"):
        ModelRunner(model, num_pages=4, attention="fastest-please")
    monkeypatch.setenv("CRUCIBLE_PREFILL_ATTN", "fastest-please")
    with pytest.raises(ConfigError, match="exact-q4-k64"):
        LLM(model, device="cpu")


def test_generate_profile_on_cpu(tmp_path) -> None:
    from crucible.model.tiny import save_hf_dir, tiny_random_model

    save_hf_dir(tiny_random_model(seed=0), tmp_path / "tiny")
    out = run_cli("generate", "--prompt", "the cat", "--max-tokens", "4", "--temperature", "0",
                  "--device", "cpu", "--model", str(tmp_path / "tiny"), "--profile")
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stderr.splitlines() if x.startswith("[profile")]
    assert len(line) == 1
    for stage in ("qkv", "attention", "gate_up", "down", "norm", "final", "sampling"):
        assert f" {stage} " in line[0]


def test_chat_session_over_stdin(tmp_path) -> None:
    """Two turns, a /reset, then an empty line quits; every answer streams after 'assistant>'."""
    from crucible.model.tiny import save_hf_dir, tiny_random_model

    save_hf_dir(tiny_random_model(seed=0), tmp_path / "tiny")
    out = subprocess.run([sys.executable, "-m", "crucible", "chat", "--model", str(tmp_path / "tiny"),
                          "--device", "cpu", "--max-tokens", "5", "--temperature", "0", "--stats"],
                         input="hello there\nand again\n/reset\nfresh start\n\n",
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("assistant> ") == 3
    assert out.stdout.count("you> ") == 5  # three questions, /reset, the empty line
    assert out.stderr.count("[prompt ") == 3
    # the second turn carries the first as history; after /reset the prompt is short again
    lens = [int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("[prompt")]
    assert lens[1] > lens[0] and lens[2] < lens[1]


@pytest.mark.parametrize("flags,message", [
    (["--kv-cache-memory", "40"], "expected a size with a unit"),
    (["--kv-cache-memory=-2GiB"], "expected a size with a unit"),
    (["--gpu-memory-fraction", "1.5"], "must be in (0, 1]"),
    (["--num-pages", "8", "--kv-cache-memory", "1GiB"], "not allowed with argument"),
])
def test_pool_flags_are_strict(flags: list[str], message: str) -> None:
    out = run_cli("generate", "--prompt", "hi", "--device", "cpu", *flags)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_generate_reports_the_pool_at_start(tmp_path) -> None:
    from crucible.model.tiny import save_hf_dir, tiny_random_model

    save_hf_dir(tiny_random_model(seed=0), tmp_path / "tiny")
    out = run_cli("generate", "--prompt", "the cat", "--max-tokens", "2", "--temperature", "0",
                  "--device", "cpu", "--model", str(tmp_path / "tiny"))
    assert out.returncode == 0, out.stderr
    assert "crucible: KV pool: 64 pages (1,024 positions" in out.stderr
    assert "two full contexts (CPU default)" in out.stderr
    out = run_cli("generate", "--prompt", "the cat", "--max-tokens", "2", "--device", "cpu",
                  "--model", str(tmp_path / "tiny"), "--kv-cache-memory", "1GiB")
    assert out.returncode == 2 and "on the CPU give num_pages" in out.stderr
