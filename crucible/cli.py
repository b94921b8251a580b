"""``llm-engine``: the command line. Each subcommand lives in its own module.

    llm-engine generate --prompt TEXT [--chat] [--max-tokens N] ...
    llm-engine chat                      interactive terminal chat
    llm-engine serve ...                 HTTP server (native, OpenAI, Anthropic APIs)
    llm-engine gpu-prefill-attention-check / gpu-prefill-attention-bench
"""

from __future__ import annotations

import importlib
import sys

from crucible.errors import CrucibleError

# name -> (module, function, one-line help); modules load only when their command runs.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "generate": ("crucible.cli_generate", "generate_main", "generate text from a prompt"),
    "chat": ("crucible.chat.main", "chat_main", "interactive chat in the terminal"),
    "serve": ("crucible.cli_serve", "serve_main", "serve the HTTP APIs"),
    "gpu-engine-check": ("crucible.checks.engine_check", "main",
                         "check the CuPy backend against the numpy oracle and itself"),
    "gpu-packed-prefill-check": ("crucible.checks.packed_check", "main",
                                 "packed generation == one-at-a-time reference, bitwise"),
    "gpu-eval": ("crucible.checks.eval", "main",
                 "cross-entropy and perplexity on the shipped held-out text"),
    "gpu-batch": ("crucible.checks.batch_check", "batch_main",
                  "a needle request alone == inside batches of 1..64, bitwise"),
    "gpu-paged": ("crucible.checks.batch_check", "paged_main",
                  "shuffled/interleaved pages == contiguous pages, bitwise"),
    "gpu-graph-check": ("crucible.checks.graph_check", "graph_main",
                        "decode graph replay == eager, bitwise"),
    "gpu-decode-prefill": ("crucible.checks.graph_check", "decode_prefill_main",
                           "decode step t == prefill of prompt + generated[:t], bitwise"),
    "gpu-sampling": ("crucible.checks.sampling_check", "main",
                     "device sampler == host sampler (RNG bits, matrix, batches, chi-square)"),
    "gpu-validate": ("crucible.checks.validate", "main", "run every gpu-* check, summary table"),
    "gpu-prefill-attention-check": ("crucible.checks.attention_check", "main",
                                    "check every attention variant against the reference"),
    "gpu-prefill-attention-bench": ("crucible.checks.attention_bench", "main",
                                    "benchmark attention variants"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: llm-engine COMMAND [options]   (llm-engine COMMAND --help for options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {spec[2]}" for name, spec in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from crucible import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"llm-engine: error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        entry = getattr(importlib.import_module(module), func)
    except ImportError as exc:
        print(f"llm-engine: error: {name} is unavailable here: {exc}", file=sys.stderr)
        return 2
    try:
        return int(entry(rest) or 0)
    except CrucibleError as exc:
        print(f"llm-engine: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
