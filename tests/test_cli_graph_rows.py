"""``--mixed-graph-rows`` (generate, serve, chat): the largest packed mixed step a CUDA graph
replays, over CRUCIBLE_MIXED_GRAPH_ROWS, through the one settings object; a value outside
the row buckets is refused by name; chat refuses it with --url (the server has its own)."""

from __future__ import annotations

import pytest


def test_generate_flag_over_the_environment(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture,
                                            generate_settings) -> None:
    from crucible import cli_generate

    cases = ((["--mixed-graph-rows", "1024"], None, 1024), ([], None, 512),
             ([], "768", 768), (["--mixed-graph-rows", "256"], "1024", 256))
    for argv, env, want in cases:
        monkeypatch.delenv("CRUCIBLE_MIXED_GRAPH_ROWS", raising=False)
        if env is not None:
            monkeypatch.setenv("CRUCIBLE_MIXED_GRAPH_ROWS", env)
        got = generate_settings(argv)
        assert got.mixed_graph_rows == want, (argv, env)
        assert got.backend_options().mixed_graph_rows == want
    p = cli_generate.generate_parser()
    for bad in ("1000", "two"):
        with pytest.raises(SystemExit):
            p.parse_args(["--prompt", "x", "--mixed-graph-rows", bad])
        assert "--mixed-graph-rows" in capsys.readouterr().err


def test_serve_and_chat_take_it() -> None:
    from crucible.chat.main import chat_parser
    from crucible.cli_serve import parser as serve_parser

    assert serve_parser().parse_args(["--mixed-graph-rows", "1024"]).mixed_graph_rows == 1024
    assert serve_parser().parse_args([]).mixed_graph_rows is None  # the environment or 1024
    assert chat_parser().parse_args(["--mixed-graph-rows", "640"]).mixed_graph_rows == 640


def test_chat_refuses_it_with_a_server(capsys: pytest.CaptureFixture) -> None:
    from crucible.chat.main import chat_main

    with pytest.raises(SystemExit):
        chat_main(["--url", "http://127.0.0.1:9", "--mixed-graph-rows", "1024"])
    assert "--mixed-graph-rows does not apply with --url" in capsys.readouterr().err


def test_serve_defaults_to_1024_rows() -> None:
    """A server's own default (SERVE_MIXED_GRAPH_ROWS) under the environment and the flag;
    generate and LLM keep Settings' 512."""
    from crucible.cli_serve import SERVE_MIXED_GRAPH_ROWS, parser, serve_settings
    from crucible.engine.settings import Settings

    assert SERVE_MIXED_GRAPH_ROWS == 1024 != Settings().mixed_graph_rows
    cases = (([], {}, 1024), ([], {"CRUCIBLE_MIXED_GRAPH_ROWS": "512"}, 512),
             (["--mixed-graph-rows", "256"], {"CRUCIBLE_MIXED_GRAPH_ROWS": "768"}, 256),
             (["--mixed-graph-rows", "640"], {}, 640))
    for argv, env, want in cases:
        got = serve_settings(parser().parse_args(argv), env)
        assert got.mixed_graph_rows == want, (argv, env)
    shown = " ".join(parser().format_help().split())
    assert "(default: CRUCIBLE_MIXED_GRAPH_ROWS or 1024)" in shown


def test_serve_keeps_a_budget_of_1024_and_generate_takes_2048(generate_settings) -> None:
    """A stream waits a whole step for each token, so a server keeps the smaller steps;
    an offline run takes the larger (SERVE_TOKEN_BUDGET against Settings' default)."""
    from crucible.cli_serve import SERVE_TOKEN_BUDGET, parser, serve_settings
    from crucible.engine.settings import Settings

    assert SERVE_TOKEN_BUDGET == 1024 != Settings().token_budget == 2048
    for argv, want in (([], 1024), (["--token-budget", "4096"], 4096)):
        got = serve_settings(parser().parse_args(argv), {})
        assert got.token_budget == want and got.running_limit() == 512, argv
    assert generate_settings([]).token_budget == 2048
    assert generate_settings(["--token-budget", "96"]).running_limit() == 48
    assert "(default: 1024)" in " ".join(parser().format_help().split())
