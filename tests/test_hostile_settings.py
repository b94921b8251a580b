"""Hostile start-up input outside HTTP: environment variables, CLI flags, cache and paths.

Each bad value is one clear error naming the variable, flag or path (exit code 2 from the
CLI), never a traceback, a MemoryError or an API left open without a word.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from crucible.cli import main
from crucible.cli_serve import parser as serve_parser
from crucible.engine import pool_size as pool_module
from crucible.engine.pool_size import pool_size
from crucible.engine.settings import ENV, Settings
from crucible.errors import ConfigError
from crucible.model.tiny import tiny_config

NUMERIC = [v for v, (_, parse) in ENV.items() if parse.__name__ in
           ("_threads", "_graph_rows", "_positive")]


def test_numeric_variables_are_known() -> None:
    assert {"CRUCIBLE_CPU_THREADS", "CRUCIBLE_MIXED_GRAPH_ROWS",
            "CRUCIBLE_PREFIX_CACHE_MAX_TOKENS", "CRUCIBLE_PREFIX_CACHE_ENTRIES"} <= set(NUMERIC)


@pytest.mark.parametrize("var", NUMERIC)
@pytest.mark.parametrize("raw", ["²", "1²", "٣", "١٢٨", "\u00b9\u00b2\u2078"])
def test_non_ascii_digits_name_the_variable(var: str, raw: str) -> None:
    # '²'.isdigit() is True but int('²') raises: it was a bare ValueError traceback.
    with pytest.raises(ConfigError, match=var):
        Settings.from_env({var: raw})


@pytest.mark.parametrize("var", ["CRUCIBLE_CACHE", "CRUCIBLE_CORE_PROFILE"])
def test_path_variables_refuse_nul(var: str) -> None:
    with pytest.raises(ConfigError, match=f"{var} must be a path"):
        Settings.from_env({var: "/tmp/a\0b"})


@pytest.mark.parametrize("field, value", [("cache_dir", "x\0y"), ("core_profile", 5),
                                          ("cache_dir", ["/tmp"])])
def test_path_arguments_are_checked(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be a path"):
        Settings(**{field: value})


@pytest.fixture()
def host_64gib(monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "host_memory", lambda: 64 << 30)


def test_pool_larger_than_host_memory_is_refused(host_64gib) -> None:
    cfg = tiny_config()
    with pytest.raises(ConfigError, match=r"KV pool of 1,000,000,000,000 pages.*num_pages"):
        pool_size(Settings(num_pages=10**12), cfg, "cpu", None)
    # On CUDA, explicit num_pages beyond the free device memory.
    with pytest.raises(ConfigError, match="free on the device"):
        pool_size(Settings(num_pages=10**6), cfg, "cuda", (1 << 20, 1 << 30))
    assert pool_size(Settings(num_pages=64), cfg, "cpu", None).num_pages == 64


def test_cpu_default_pool_of_a_huge_context_is_refused(host_64gib) -> None:
    cfg = tiny_config(max_context=1 << 20, n_layers=64, n_kv_heads=4, head_dim=256,
                      n_heads=4)  # 2 contexts x 64 layers x 1024 kv x 8 B = 1 TiB
    with pytest.raises(ConfigError, match=r"64.00 GiB of memory on this host \(two full "
                       r"contexts.*give a smaller num_pages"):
        pool_size(Settings(), cfg, "cpu", None)


def cli(capsys, *args: str) -> tuple[int, str]:
    try:
        rc = main(list(args))
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    return rc, capsys.readouterr().err


GEN = ("generate", "--device", "cpu", "--max-tokens", "2")


def test_generate_num_pages_beyond_memory(capsys) -> None:
    rc, err = cli(capsys, *GEN, "--model", "tiny-random", "--prompt", "hi",
                  "--num-pages", "100000000000")
    assert rc == 2 and "more than the" in err and "Traceback" not in err


@pytest.mark.parametrize("prompt", ["a\udcffb", "\udc80"])
def test_prompt_that_is_not_utf8(capsys, prompt: str) -> None:
    # argv bytes that are not UTF-8 arrive as lone surrogates: was a TypeError traceback.
    rc, err = cli(capsys, *GEN, "--model", "tiny-random", "--prompt", prompt)
    assert rc == 2 and "not valid UTF-8" in err


def test_prompt_from_stdin_that_is_not_utf8(capsys, monkeypatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"x\xff\xfe"), encoding="utf-8",
                             errors="surrogateescape")
    monkeypatch.setattr(sys, "stdin", stdin)
    rc, err = cli(capsys, *GEN, "--model", "tiny-random", "--prompt", "-")
    assert rc == 2 and "byte 0xff at character 1" in err


@pytest.mark.parametrize("model, message", [
    ("", "the model is empty"), ("   ", "the model is empty"),
    ("/dev/null", "/dev/null: not a regular file or a directory"),
])
def test_bad_model_paths(capsys, model: str, message: str) -> None:
    # "" used to load "." as an HF directory; /dev/null was "no such model file".
    rc, err = cli(capsys, *GEN, "--model", model, "--prompt", "hi")
    assert rc == 2 and message in err


def test_cache_that_is_a_file(capsys, monkeypatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("CRUCIBLE_CACHE", str(blocker))
    rc, err = cli(capsys, *GEN, "--prompt", "hi")  # the default, downloaded model
    assert rc == 2 and "CRUCIBLE_CACHE" in err and "Not a directory" in err


@pytest.mark.parametrize("key, message", [("", "the key is empty"), ("  ", "the key is empty"),
                                          (" k", "surrounding blanks"),
                                          ("k\n", "surrounding blanks"),
                                          ("a\x01b", "control characters")])
def test_serve_refuses_an_unusable_api_key(capsys, key: str, message: str) -> None:
    # --api-key "" served an open API: the key check is skipped for a false-y key. The
    # parser alone is asked, so without the check this fails instead of serving forever.
    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args(["--api-key", key])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--api-key" in err and message in err
    assert serve_parser().parse_args(["--api-key", "k-1"]).api_key == "k-1"


def test_chat_history_path_is_checked_first(capsys, tmp_path: Path) -> None:
    rc, err = cli(capsys, "chat", "--model", "tiny-random", "--history", str(tmp_path))
    assert rc == 2 and "is not a file name" in err
    rc, err = cli(capsys, "chat", "--model", "tiny-random", "--history",
                  str(tmp_path / "no" / "h.txt"))
    assert rc == 2 and "no directory" in err
