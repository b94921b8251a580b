"""``llm-engine chat``: its flags, and choosing the backend and the terminal.

Without --url the model loads here (the flags of generate pick it and its pool); with
--url the chat is one more client of a running server, whose model and pool are its own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crucible.chat import commands
from crucible.chat.session import ChatSession
from crucible.chat.term import NEWLINE_KEYS, open_terminal
from crucible.cli_args import POOL_FLAGS, Parser, add_model_options, add_sampling_options

# Options that pick or size a model here: a server has its own, so --url refuses them.
_LOCAL_ONLY = ("model", "device", "weights", "gemm", "mixed_graph_rows") + POOL_FLAGS


def chat_parser() -> argparse.ArgumentParser:
    p = Parser(prog="llm-engine chat",
               description=f"Chat in the terminal. Enter sends; {NEWLINE_KEYS}; Ctrl-C "
                           "stops a reply; Ctrl-D or /exit quits; /help lists the commands. "
                           "From a pipe it reads line by line and ends at end of input or "
                           "an empty line.")
    p.add_argument("--system", default=None, help="system prompt (/system changes it)")
    p.add_argument("--stats", action="store_true",
                   help="print a stats line on stderr after each reply")
    p.add_argument("--url", default=None,
                   help="chat with a running Crucible (or OpenAI-compatible) server at this "
                        "address, e.g. http://127.0.0.1:8000, instead of loading a model "
                        "(default: load the model here)")
    p.add_argument("--api-key", default=None, help="the server's API key (with --url)")
    p.add_argument("--history", default=None, metavar="FILE",
                   help="keep the input history in FILE across sessions (default: this "
                        "session only)")
    p.set_defaults(profile=False)
    add_sampling_options(p, max_tokens=512)
    add_model_options(p)
    return p


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.history is not None:
        # The history file is first written after the first message: a bad path would
        # end the chat there with a traceback, so it is refused before anything loads.
        history = Path(args.history).expanduser()
        if not args.history.strip() or history.is_dir():
            p.error(f"--history {args.history!r} is not a file name")
        if not history.parent.is_dir():
            p.error(f"--history {args.history!r}: no directory {str(history.parent)!r}")
    if args.url is None:
        if args.api_key is not None:
            p.error("--api-key needs --url")
        return
    given = [d for d in _LOCAL_ONLY if getattr(args, d) != p.get_default(d)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        p.error(f"{flag} does not apply with --url: the server has its own model and pool")


def chat_main(argv: list[str]) -> int:
    p = chat_parser()
    args = p.parse_args(argv)
    _check(p, args)
    # Model text may hold any code point; an odd terminal encoding must not end the chat.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="replace")
    if args.url is not None:
        from crucible.chat.remote import RemoteBackend

        backend = RemoteBackend(args.url, args.api_key, args)
    else:
        from crucible.chat.local import LocalBackend

        backend = LocalBackend.from_args(args)
    try:
        term = open_terminal(args.history, commands.COMMANDS)
        session = ChatSession(backend, term, system=args.system, show_stats=args.stats)
        return commands.run(session)
    finally:
        backend.close()
