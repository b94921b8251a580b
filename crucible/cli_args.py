"""Argument types and the option groups shared by generate, chat and serve."""

from __future__ import annotations

import argparse

from crucible.arg_types import int_in, non_negative_int, positive_int  # noqa: F401 (re-exported)
from crucible.backend.options import GEMMS, MIXED_GRAPH_ROWS
from crucible.engine.settings import RUNNING_CAP, Settings, given_cache_size
from crucible.engine.sizes import UNITS_HELP, parse_bytes
from crucible.errors import ConfigError
from crucible.model.fetch import DEFAULT_MODEL


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line plus a pointer to --help (exit code 2),
    and whose --help shows every option's default (DefaultsFormatter)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to each option that takes a value, unless its help already
    says its default in words; an unset (None) default reads "(default: none)"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS or action.nargs == 0 \
                or action.required or not action.option_strings:
            return text
        if action.default is None:
            return f"{text} (default: none)".strip()
        return f"{text} (default: %(default)s)".strip()




def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def temperature(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def probability(text: str) -> float:
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a size with a unit ({UNITS_HELP}), e.g. "
                                         f"40GiB; got {text!r}") from None


def cache_size(text: str) -> int:
    """--prefix-cache-size: 0 (off) or a size in GB or GiB (settings.given_cache_size)."""
    try:
        return given_cache_size("--prefix-cache-size", text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--prefix-cache-size ")) from None


def api_key(text: str) -> str:
    """An API key as the server compares it. An empty one (``--api-key "$KEY"`` with KEY
    unset) would leave the API open without a word; surrounding blanks or control
    characters could never be sent back in a header, so no client could ever match it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the key is empty; leave the option out to serve "
                                         "without a key")
    if text != text.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise argparse.ArgumentTypeError("the key has surrounding blanks or control "
                                         "characters, which no HTTP header can carry")
    return text


def add_pool_options(g: argparse._ArgumentGroup,
                     budget_default: int = Settings.token_budget) -> None:
    """The KV pool and scheduler limits (generate, chat and serve share them).
    ``budget_default``: what --token-budget falls back to (serve's is its own)."""
    pool = g.add_mutually_exclusive_group()
    pool.add_argument("--num-pages", type=positive_int, default=None,
                      help="KV pages of 16 positions in the pool (default: two full contexts "
                           "on the CPU; on CUDA 0.9 of the memory free after weights)")
    pool.add_argument("--kv-cache-memory", type=byte_size, default=None, metavar="SIZE",
                      help="CUDA: the KV pool's size, e.g. 40GiB or 30GB (default: from "
                           "--gpu-memory-fraction)")
    pool.add_argument("--gpu-memory-fraction", type=probability, default=None, metavar="F",
                      help="CUDA: the fraction of the memory free after weights and step "
                           "scratch that the KV pool takes (default: 0.9)")
    g.add_argument("--token-budget", type=positive_int, default=None,
                   help=f"rows per packed step (default: {budget_default})")
    g.add_argument("--chunk-cap", type=positive_int, default=None,
                   help="longest prefill slice of one request per step (default: off)")
    g.add_argument("--max-running", type=positive_int, default=None,
                   help="admitted requests holding pages at once (default: half the token "
                        f"budget, at most {RUNNING_CAP})")
    g.add_argument("--prefix-cache-size", type=cache_size, default=None, metavar="SIZE",
                   help="the prefix cache's resident budget in GB or GiB (e.g. 3.5GiB), 0 "
                        "turns it off (default: CRUCIBLE_PREFIX_CACHE_SIZE, else the pool)")
    g.add_argument("--prefix-cache-max-tokens", type=positive_int, default=None, metavar="N",
                   help="the longest prefix the cache keeps of a chain (default: "
                        f"CRUCIBLE_PREFIX_CACHE_MAX_TOKENS or {Settings.prefix_cache_max_tokens})")
    g.add_argument("--prefix-cache-entries", type=positive_int, default=None, metavar="N",
                   help="the most chains the cache keeps (default: "
                        f"CRUCIBLE_PREFIX_CACHE_ENTRIES or {Settings.prefix_cache_entries})")


# add_pool_options' flags, by their Settings field
POOL_FLAGS = ("num_pages", "kv_cache_memory", "gpu_memory_fraction", "token_budget",
              "chunk_cap", "max_running", "prefix_cache_size", "prefix_cache_max_tokens",
              "prefix_cache_entries")


def pool_flags(args: argparse.Namespace) -> dict[str, object]:
    """The pool, scheduler and prefix-cache flags as Settings fields (None: not given)."""
    return {name: getattr(args, name) for name in POOL_FLAGS}


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help="known model name, .gguf file or HF directory")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto picks CUDA when the CuPy backend and a GPU are there")
    g.add_argument("--weights", choices=("int8", "f32"), default="int8",
                   help="linear-layer weights: int8 per-channel or f32")
    add_gemm_option(g)
    add_pool_options(g)


def add_gemm_option(g: argparse._ActionsContainer,
                    rows_default: int = Settings.mixed_graph_rows) -> None:
    """The CUDA knobs that trade one workload's speed for another's (never the bits of a
    given order: a graph replays its eager step bit for bit). ``rows_default``: what
    --mixed-graph-rows falls back to (serve's is its own)."""
    g.add_argument("--gemm", choices=GEMMS, default=None,
                   help="CUDA int8 GEMMs: mma (tensor cores, the default: 1.36x the "
                        "throughput under load, the same batch-1 speed) or fma (CUDA cores: "
                        "the CPU backend's bits) (default: CRUCIBLE_GEMM or mma)")
    g.add_argument("--mixed-graph-rows", type=int, choices=MIXED_GRAPH_ROWS, default=None,
                   metavar="ROWS",
                   help="CUDA: the largest packed mixed step replayed from a CUDA graph, one "
                        f"of {', '.join(map(str, MIXED_GRAPH_ROWS))} (1024 serves 256 "
                        "streaming clients 1.1-1.4x faster than 512; an offline batch pays "
                        "~1 s of captures for it: docs/throughput.md) (default: "
                        f"CRUCIBLE_MIXED_GRAPH_ROWS or {rows_default})")


def add_sampling_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=positive_int, default=max_tokens,
                   help="tokens to generate at most")
    g.add_argument("--temperature", type=temperature, default=0.8, help="0 is greedy")
    g.add_argument("--top-k", type=positive_int, default=None,
                   help="keep the k likeliest tokens (default: off)")
    g.add_argument("--top-p", type=probability, default=0.95, help="nucleus mass to keep")
    g.add_argument("--min-p", type=temperature, default=0.0,
                   help="drop tokens below min_p x the top probability")
    g.add_argument("--repetition-penalty", type=positive_float, default=1.0, metavar="P",
                   help="tokens already in the prompt or output: positive logits / P, "
                        "negative x P (1 is off)")
    g.add_argument("--seed", type=non_negative_int, default=0,
                   help="sampling seed; the same seed gives the same text")
