"""The prefix cache's settings beyond the environment (issue #17: "the matching CLI flags and
LLM(...) arguments through the one settings object"): --prefix-cache-size, -max-tokens and
-entries on generate, chat and serve, and LLM's prefix_cache_* arguments, each over
CRUCIBLE_PREFIX_CACHE_*, with the environment's strict parsing and clear errors."""

from __future__ import annotations

import pytest

from crucible.api import LLM
from crucible.engine.settings import Settings
from crucible.errors import ConfigError
from crucible.model.tiny import tiny_random_model

GiB = 1 << 30
FLAGS = ["--prefix-cache-size", "1.5GiB", "--prefix-cache-max-tokens", "512",
         "--prefix-cache-entries", "64"]


def test_generate_flags_reach_settings_over_the_environment(
        generate_settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_PREFIX_CACHE_SIZE", "0")
    monkeypatch.setenv("CRUCIBLE_PREFIX_CACHE_ENTRIES", "7")
    env_only = generate_settings([])
    assert (env_only.prefix_cache_size, env_only.prefix_cache_entries) == (0, 7)
    got = generate_settings(FLAGS)
    assert (got.prefix_cache_size, got.prefix_cache_max_tokens,
            got.prefix_cache_entries) == (3 * GiB // 2, 512, 64)
    assert generate_settings(["--prefix-cache-size", "2GB"]).prefix_cache_size == 2 * 10 ** 9
    on = generate_settings(["--prefix-cache-size", "1GiB"])
    assert on.prefix_cache_size == GiB and on.prefix_cache_entries == 7  # the env's stays


def test_serve_flags_reach_settings() -> None:
    from crucible.cli_serve import parser, serve_settings

    got = serve_settings(parser().parse_args(FLAGS), {"CRUCIBLE_PREFIX_CACHE_MAX_TOKENS": "99"})
    assert (got.prefix_cache_size, got.prefix_cache_max_tokens,
            got.prefix_cache_entries) == (3 * GiB // 2, 512, 64)
    off = serve_settings(parser().parse_args(["--prefix-cache-size", "0"]), {})
    assert off.prefix_cache_size == 0 and off.prefix_cache_max_tokens == 8192
    assert serve_settings(parser().parse_args([]), {}).prefix_cache_size is None  # the pool


@pytest.mark.parametrize("flags,message", [
    (["--prefix-cache-size", "3"], "must be a size with a unit (GB, GiB)"),
    (["--prefix-cache-size", "2MB"], "must be a size with a unit (GB, GiB)"),
    (["--prefix-cache-size", "50%"], "must be a size with a unit (GB, GiB)"),
    (["--prefix-cache-size=-1GiB"], "must be a size with a unit (GB, GiB)"),
    (["--prefix-cache-size", "auto"],
     "must be 0 or a size in GB or GiB, got 'auto'; leave it out for the default"),
    (["--prefix-cache-max-tokens", "0"], "--prefix-cache-max-tokens"),
    (["--prefix-cache-entries", "many"], "--prefix-cache-entries"),
])
def test_bad_flags_exit_2_naming_the_flag(flags: list[str], message: str,
                                          capsys: pytest.CaptureFixture) -> None:
    from crucible.cli_generate import generate_parser

    with pytest.raises(SystemExit) as e:
        generate_parser().parse_args(["--prompt", "x", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "--prefix-cache" in err, err


def test_chat_refuses_them_with_a_server(capsys: pytest.CaptureFixture) -> None:
    from crucible.chat.main import chat_main

    with pytest.raises(SystemExit):
        chat_main(["--url", "http://127.0.0.1:9", "--prefix-cache-size", "0"])
    assert "--prefix-cache-size does not apply with --url" in capsys.readouterr().err


def test_llm_arguments_size_and_switch_the_cache() -> None:
    model = tiny_random_model(seed=0)
    off = LLM(model, device="cpu", num_pages=64, prefix_cache_size=0)
    assert off.settings.prefix_cache_size == 0 and off.engine.prefix_cache is None
    on = LLM(model, device="cpu", num_pages=64, prefix_cache_size="1GiB",
             prefix_cache_max_tokens=256, prefix_cache_entries=8)
    assert (on.settings.prefix_cache_size, on.settings.prefix_cache_max_tokens,
            on.settings.prefix_cache_entries) == (GiB, 256, 8)
    assert on.engine.prefix_cache is not None
    # a given argument overrides the settings passed whole; a left-out one keeps them
    s = Settings(device="cpu", num_pages=64, prefix_cache_size=0, prefix_cache_entries=5)
    mixed = LLM(model, settings=s, prefix_cache_size=GiB)
    assert mixed.settings.prefix_cache_size == GiB and mixed.settings.prefix_cache_entries == 5
    assert mixed.engine.prefix_cache is not None


@pytest.mark.parametrize("kw,message", [
    ({"prefix_cache_size": "3"}, "prefix_cache_size must be a size with a unit (GB, GiB)"),
    ({"prefix_cache_size": "auto"},
     "prefix_cache_size must be 0 or a size in GB or GiB, got 'auto'; leave it out"),
    ({"prefix_cache_size": -1}, "prefix_cache_size"),
    ({"prefix_cache_max_tokens": 0}, "prefix_cache_max_tokens"),
    ({"prefix_cache_entries": "4"}, "prefix_cache_entries"),
])
def test_llm_refuses_bad_values_by_name(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LLM(tiny_random_model(seed=0), device="cpu", num_pages=64, **kw)


def test_generate_stats_prints_the_caches_counters(capsys: pytest.CaptureFixture) -> None:
    from crucible.cli import main

    argv = ["generate", "--prompt", "the cat sat on the mat and the dog", "--device", "cpu",
            "--model", "tiny-random", "--max-tokens", "3", "--temperature", "0"]
    assert main(argv + ["--stats"]) == 0
    err = capsys.readouterr().err
    assert "[engine: " in err and "prefix cache: 0 cached tokens in 0 hits of 1 queries" in err
    assert "1 pages admitted" in err  # the prompt's one full page, published when it ended
    assert main(argv + ["--prefix-cache-size", "0", "--stats"]) == 0
    assert "of 0 queries, 0 pages admitted" in capsys.readouterr().err  # no cache: zeros
    assert main(argv) == 0 and "[engine: " not in capsys.readouterr().err
