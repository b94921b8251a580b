"""``llm-engine serve``: parse flags, start the HTTP server, load the model, serve forever.

The engine runs in a process of its own (crucible/server/engine_client.py), so the HTTP
front's tokenising, detokenising and JSON/SSE never compete with the step loop for one
interpreter; ``--engine-in-process`` keeps it in a worker thread of the server instead.
``--model tiny-random`` (hidden from --help) serves the tiny random model of
crucible/model/tiny.py: no download, fast on CPU, for tests and the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Mapping

from crucible.backend.select import resolve_device
from crucible.cli_args import (Parser, add_gemm_option, add_pool_options, api_key, int_in,
                               non_negative_int, pool_flags, positive_float, positive_int)
from crucible.engine.factory import build_engine, freeze_startup
from crucible.engine.settings import Settings
from crucible.errors import CrucibleError
from crucible.model.fetch import DEFAULT_MODEL
from crucible.server.engine_client import EngineProcessConfig
from crucible.server.launch import EngineSource, start_server, stop_server
from crucible.server.state import (MAX_BODY_BYTES, MAX_CONNECTIONS, MAX_RESPONSE_ENTRIES,
                                   READ_TIMEOUT_S, ServerConfig, ServerState)

log = logging.getLogger("crucible.server")

# A server's own default for the largest mixed step a CUDA graph replays (LLM and generate
# keep Settings' 512; the bits are the same either way). A server is host-bound under load
# and lives long enough to amortise the captures: at 256 streaming clients 1,024 rows gave
# 1.11x (fma) and 1.40x (mma) the output tok/s of 512, where a 15-second offline batch
# pays ~1 s of captures for them (bench/mixed-graph-slice-capacity-h200.json). vLLM also
# picks its batching defaults by entry point.
SERVE_MIXED_GRAPH_ROWS = 1024
# A server's own token budget (LLM and generate: Settings' 2,048). A decode row waits a
# whole step for its next token, and a step of 2,048 rows takes ~20 ms on the H200 where
# one of 1,024 takes ~12: an offline batch gains 1.10-1.44x from the larger steps
# (bench/token-budget-mma-h200.json), a stream's gaps grow with the step, and 64 cached
# chat users waited 46.7 ms for a first token instead of 36.8 (docs/prefix-cache.md).
SERVE_TOKEN_BUDGET = 1024
# HTTP fronts when --api-servers is not given, on CUDA with the engine in its own process.
# One front serves ~30k streamed tokens/s on one core; under the default mma order the H200
# engine outruns it at 256 clients, where two fronts gave 1.05-1.10x the output tok/s, a
# TTFT p50 of 26 ms instead of 122-214 and /health within 8 ms instead of 226-314
# (bench/serve-fronts-mma-h200.json). The CPU engine is far below one front's rate.
SERVE_CUDA_FRONTS = 2


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="llm-engine serve",
               description="Serve a model over HTTP (native, OpenAI and Anthropic APIs).")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int_in(0, 65535), default=8000, help="TCP port; 0 picks a free one")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="model name, .gguf path or HF directory")
    p.add_argument("--served-model-name", default=None,
                   help="the id clients send as 'model' (default: --model)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto picks CUDA when the CuPy backend and a GPU are there; checked "
                        "before listening")
    p.add_argument("--weights", default="int8", choices=("int8", "f32"),
                   help="linear-layer weights: int8 per-channel or f32")
    add_gemm_option(p, rows_default=SERVE_MIXED_GRAPH_ROWS)
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="waiting-queue bound; beyond it requests get 429 at once")
    add_pool_options(p.add_argument_group("pool and scheduler"), SERVE_TOKEN_BUDGET)
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="base seed for unseeded requests")
    p.add_argument("--api-key", type=api_key, default=None,
                   help="require this key (Bearer or x-api-key); without one the API is open")
    lim = p.add_argument_group("request limits (docs/serving.md)")
    lim.add_argument("--max-body-bytes", type=positive_int, default=MAX_BODY_BYTES,
                     help="largest request body, after Content-Encoding (413 beyond it)")
    lim.add_argument("--read-timeout", type=positive_float, default=READ_TIMEOUT_S,
                     help="seconds for a request's headers to arrive, for a body to make "
                          "progress, and for an idle keep-alive connection")
    lim.add_argument("--max-connections", type=positive_int, default=MAX_CONNECTIONS,
                     help="open connections; beyond it the oldest idle one is closed, or the "
                          "new one gets 503 when all are busy")
    lim.add_argument("--max-response-entries", type=positive_int, default=MAX_RESPONSE_ENTRIES,
                     help="per-request budget of n x max_tokens x (1 + top_logprobs)")
    p.add_argument("--engine-in-process", action="store_true",
                   help="run the engine in a thread of the server process instead of a "
                        "process of its own (the default); for debugging and comparison")
    p.add_argument("--api-servers", type=int_in(1, 64), default=None,
                   help="HTTP front processes sharing the port and one engine process: each "
                        "front serves ~30k streamed tokens/s, so a GPU busier than that "
                        f"wants 2-4 (default: {SERVE_CUDA_FRONTS} on CUDA, 1 on the CPU or "
                        "with --engine-in-process; docs/serving.md)")
    p.add_argument("--log-level", default="info", type=str.lower,
                   choices=("debug", "info", "warning", "error", "critical"),
                   help="info logs one access line per request (logger crucible.server.access)")
    return p


def default_fronts(device: str, engine_in_process: bool) -> int:
    """--api-servers when not given: SERVE_CUDA_FRONTS where the engine has a process of
    its own on a GPU, else one."""
    return SERVE_CUDA_FRONTS if device == "cuda" and not engine_in_process else 1


def _built(model: str, settings: Settings):
    built = build_engine(model, settings)
    freeze_startup()  # this process serves one engine for its whole life
    return built


def serve_settings(args: argparse.Namespace,
                   environ: Mapping[str, str] | None = None) -> Settings:
    """The flags over the environment over the server's defaults."""
    return Settings.from_env(environ, defaults={"mixed_graph_rows": SERVE_MIXED_GRAPH_ROWS,
                                                "token_budget": SERVE_TOKEN_BUDGET},
                             device=args.device, weights=args.weights, gemm=args.gemm,
                             mixed_graph_rows=args.mixed_graph_rows,
                             max_queue=args.max_queue, seed=args.seed, **pool_flags(args))


async def _serve(args: argparse.Namespace) -> int:
    settings = serve_settings(args)
    state = ServerState(ServerConfig(model_name=args.served_model_name or args.model,
                                     api_key=args.api_key, max_queue=args.max_queue,
                                     max_body_bytes=args.max_body_bytes,
                                     read_timeout=args.read_timeout,
                                     max_connections=args.max_connections,
                                     max_response_entries=args.max_response_entries))
    source: EngineSource = (  # the lambda runs in an executor thread of this process
        (lambda: _built(args.model, settings)) if args.engine_in_process
        else EngineProcessConfig(args.model, settings))
    runner, port, load = await start_server(state, args.host, args.port, source,
                                            fronts=args.api_servers, log_level=args.log_level)
    log.info("listening on http://%s:%d (loading %s on %s, %s weights, gemm %s, mixed graphs "
             "to %d rows, engine %s, %d front%s)", args.host, port, args.model,
             args.resolved_device, args.weights, settings.gemm_order(args.resolved_device),
             settings.mixed_graph_rows,
             "in this process" if args.engine_in_process else "in its own process",
             args.api_servers, "" if args.api_servers == 1 else "s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await load
    rc = 0
    if state.load_error:
        log.error("not serving: %s", state.load_error)
        rc = 1
    else:
        await stop.wait()
    log.info("shutting down")
    await stop_server(state, runner)
    return rc


def serve_main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if (args.api_servers or 1) > 1 and args.engine_in_process:
        p.error("--api-servers above 1 needs the engine in its own process "
                "(drop --engine-in-process)")
    # The device is checked before anything listens: "--device cuda" without a GPU is one
    # line and exit code 2, not "listening", a model load and the error twice.
    try:
        args.resolved_device = resolve_device(args.device)
    except CrucibleError as exc:
        print(f"llm-engine serve: error: {exc}", file=sys.stderr)
        return 2
    if args.api_servers is None:
        args.api_servers = default_fronts(args.resolved_device, args.engine_in_process)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_serve(args))
    except CrucibleError as exc:
        log.error("%s", exc)
        return 2
    except OSError as exc:  # e.g. the port is taken
        log.error("cannot serve: %s", exc)
        return 1


if __name__ == "__main__":
    raise SystemExit(serve_main(sys.argv[1:]))
