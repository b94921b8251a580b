"""Many concurrent streaming HTTP clients against one server: tok/s, TTFT and inter-token
gaps as clients are added, errors (there must be none), the engine's own figures, and the
engine's batch-1 rate for comparison (issue #16 item 3).

    python3 bench/serve_clients.py --model tiny-random --device cpu --clients 1,16,64 \\
        --seconds 3 --json /tmp/serve-cpu.json
    python3 bench/serve_clients.py --model /tmp/smollm2.gguf --device cuda --mix issue,chat \\
        --json bench/serve-clients-h200.json

The server runs in its own process (``python -m crucible.cli_serve``) on a free loopback
port (serve_procs.py), so the clients never share its GIL. Its engine runs in a process of its own too,
unless ``--engine-in-process`` is given. ``--both-modes`` starts one server of each kind and
measures every level on both, alternating which goes first. ``--rounds N`` measures every
level N times and reports the medians.

Mixes are serve_mixes.py's: ``issue`` (the default), ``short`` and ``chat``; a comma list
runs several. Clients are serve_load.py's, spread over ``--client-procs`` processes.

Before a mix's first level, a warm-up runs on each server, so that one-time costs (kernel
compiles, graph captures on first sightings) stay out of the 1-client figure. It runs
``--warmup-clients`` clients for ``--warmup-seconds``, drains, then runs one client for a
quarter of that. The drain passes through every batch size below the client count.

In each level the clients start spread over ``--ramp-seconds``, run ``--settle-seconds``
more (the level's own warm-up: its queue fills to its steady length and its step shapes get
their CUDA graphs), then the ``--seconds`` window runs, then the drain (requests in flight
run to their end).

Per level, the figures come from serve_report.py (client side) and serve_metrics.py
(/metrics deltas, /health, the processes' CPU). After the levels the servers stop, and
serve_batch1.py times the engine alone on the 1-client level's requests.
``http_1_client_over_engine`` is the ratio of the two. The JSON (``--json``) holds the command,
the configuration, per-level figures (and per-round ones with ``--rounds``), the warm-ups,
the batch-1 runs, the ratios and issue #16's targets. The plot (serve_clients_plot.py)
goes next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # crucible, uninstalled too
import serve_batch1  # noqa: E402
import serve_report  # noqa: E402
from serve_clients_plot import try_draw  # noqa: E402
from serve_load import measure, ready  # noqa: E402
from serve_metrics import scrape  # noqa: E402
from serve_procs import server_command, start_servers, stop_servers  # noqa: E402
from serve_mixes import (MIX_NAMES, Served, describe, level_key, sample_text,  # noqa: E402
                         warmup_key)



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--weights", default="int8", choices=("int8", "f32"))
    p.add_argument("--mix", default="issue",
                   help=f"comma list of {', '.join(MIX_NAMES)} (serve_mixes.py)")
    p.add_argument("--clients", default="1,16,64,256,512")
    p.add_argument("--seconds", type=float, default=10.0, help="timed window per level")
    p.add_argument("--ramp-seconds", type=float, default=2.0,
                   help="client starts are spread over this, before the window opens")
    p.add_argument("--settle-seconds", type=float, default=0.0,
                   help="after the ramp, every client runs this long before the window "
                        "opens (the level's own warm-up)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every level this many times and report medians")
    p.add_argument("--warmup-seconds", type=float, default=5.0, help="0: no warm-up")
    p.add_argument("--warmup-clients", type=int, default=16)
    p.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 1) // 4)),
                   help="client processes (default: a quarter of the cores, 1 to 8)")
    p.add_argument("--max-queue", type=int, default=1024)
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--gpu-memory-fraction", type=float, default=None)
    p.add_argument("--token-budget", type=int, default=None)
    p.add_argument("--chunk-cap", type=int, default=None)
    p.add_argument("--max-running", type=int, default=None)
    p.add_argument("--engine-in-process", action="store_true",
                   help="pass --engine-in-process to the server (the engine in its thread)")
    p.add_argument("--api-servers", type=int, default=None,
                   help="the server's --api-servers: front processes over one engine "
                        "(default: the server's own, 2 on CUDA and 1 on the CPU)")
    p.add_argument("--both-modes", action="store_true",
                   help="measure the engine in its own process and in-process, alternating")
    p.add_argument("--no-engine-batch1", action="store_true",
                   help="skip the in-process batch-1 run (and so the ratio)")
    p.add_argument("--health-stall-ms", type=float, default=500.0,
                   help="a /health answer slower than this is a stall")
    p.add_argument("--server-log-level", default="warning",
                   help="the servers' --log-level (info: one access line per request)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", default=None, help="PNG path (default: the JSON's, .png); none")
    args = p.parse_args(argv)
    args.mixes = args.mix.split(",")
    bad = [m for m in args.mixes if m not in MIX_NAMES]
    if bad:
        p.error(f"--mix: unknown {', '.join(bad)} (choose from {', '.join(MIX_NAMES)})")
    args.levels = [int(c) for c in args.clients.split(",")]
    return args


async def served_model(url: str) -> tuple[Served, dict[str, Any]]:
    """What the mixes need from the served model, and the server's figures for the JSON."""
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/tokenizer_info") as r:
            info = await r.json()
        text = sample_text()
        async with s.post(url + "/tokenize", json={"prompt": text}) as r:
            count = (await r.json())["count"]
        m = await scrape(s, url)
    served = Served(context=info["model_max_length"], vocab_size=info["vocab_size"],
                    stop_ids=tuple(info["stop_token_ids"]),
                    tokens_per_word=count / len(text.split()))
    return served, {"context": served.context, "vocab_size": served.vocab_size,
                    "pages_total": int(m.get("pages_total", 0)),
                    "queue_bound": int(m.get("queue_bound", 0))}


def warm_up(pool: Any, args: argparse.Namespace, server: tuple[str, subprocess.Popen],
            mode: str, mix: str, served: Served) -> dict[str, Any]:
    """Many clients, then one: what each phase ran (requests, tokens, steps, errors)."""
    phases = []
    plan = [(args.warmup_clients, args.warmup_seconds), (1, args.warmup_seconds / 4)]
    for i, (clients, seconds) in enumerate(plan):
        keys = [warmup_key(mix, i, c) for c in range(clients)]
        lv = serve_report.level(asyncio.run(measure(pool, server[0], args.model, mix, served,
                                                    keys, seconds, 0.0, args.client_procs,
                                                    server[1].pid)))
        phases.append({"clients": clients, "seconds": seconds, "span_s": lv["span_s"],
                       "requests": lv["requests"], "tokens": lv["tokens"],
                       "errors": lv["errors"], "engine_steps": lv["engine"]["steps"],
                       "tok_per_s": lv["tok_per_s"]})
    return {"mix": mix, "engine_mode": mode, "phases": phases}


def run_levels(args: argparse.Namespace, modes: list[str], servers: dict, served: Served
               ) -> tuple[list[dict], list[dict]]:
    runs, warmups, k = [], [], 0
    ctx = multiprocessing.get_context("spawn")  # no forked copy of an event loop or a GPU
    with ProcessPoolExecutor(args.client_procs, mp_context=ctx) as pool:
        list(pool.map(ready, range(2 * args.client_procs)))
        for mix in args.mixes:
            if args.warmup_seconds > 0:
                warmups += [warm_up(pool, args, servers[m], m, mix, served) for m in modes]
            for r in range(args.rounds):
                for c in args.levels:
                    for m in (modes if k % 2 == 0 else modes[::-1]):  # alternate who's first
                        keys = [level_key(mix, c, i) for i in range(c)]
                        raw = asyncio.run(measure(pool, servers[m][0], args.model, mix, served,
                                                  keys, args.seconds, args.ramp_seconds,
                                                  args.client_procs, servers[m][1].pid,
                                                  args.settle_seconds))
                        runs.append({"mix": mix, "engine_mode": m, "round": r,
                                     **serve_report.level(raw)})
                    k += 1
    return runs, warmups


def batch1(args: argparse.Namespace, levels: list[dict], served: Served
           ) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """The in-process engine on each mix's 1-client requests; the ratios to HTTP."""
    ones = [lv for lv in levels if lv["clients"] == 1]
    if args.no_engine_batch1 or not ones:
        return [], [], {}
    llm, load_s = serve_batch1.build(args)
    runs = {}
    for mix in args.mixes:
        count = max((lv["_sent"] for lv in ones if lv["mix"] == mix), default=0)
        runs[mix] = serve_batch1.run_mix(llm, mix, served, count, args.rounds,
                                         args.warmup_clients)
    ratios = [serve_batch1.compare(lv, runs[lv["mix"]]) for lv in ones]
    info = {"load_s": round(load_s, 3), "device": llm.info.device, "backend": llm.info.backend,
            "pages": llm.info.pages, "max_running": llm.info.max_running,
            "token_budget": llm.info.token_budget}
    return [serve_batch1.summary(b) for b in runs.values()], ratios, info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = (["process", "in-process"] if args.both_modes else
             ["in-process" if args.engine_in_process else "process"])
    t_begin = time.monotonic()
    servers = start_servers(args, modes)
    try:
        served, server_info = asyncio.run(served_model(next(iter(servers.values()))[0]))
        server_info["ready_s"] = round(time.monotonic() - t_begin, 1)
        runs, warmups = run_levels(args, modes, servers, served)
    finally:  # the servers must be gone (device memory free) before the batch-1 engine
        stop_servers(servers)
    keys = dict.fromkeys((x["mix"], x["engine_mode"], x["clients"]) for x in runs)
    levels = [serve_report.median_level([x for x in runs if (x["mix"], x["engine_mode"],
                                                              x["clients"]) == key])
              for key in keys]
    levels.sort(key=lambda lv: (args.mixes.index(lv["mix"]), modes.index(lv["engine_mode"]),
                                lv["clients"]))
    b1, ratios, engine_info = batch1(args, levels, served)
    goals = serve_report.targets(levels, ratios, args.health_stall_ms)
    strip = lambda d: {k: v for k, v in d.items() if not k.startswith("_")}  # noqa: E731
    result = {
        "command": "python3 " + shlex.join(sys.argv if argv is None else ["serve_clients.py",
                                                                          *argv]),
        "config": {"model": args.model, "device": args.device, "weights": args.weights,
                   "mixes": {m: describe(m, served) for m in args.mixes},
                   "clients": args.levels, "seconds": args.seconds,
                   "ramp_seconds": args.ramp_seconds,
                   "settle_seconds": args.settle_seconds, "rounds": args.rounds,
                   "warmup": {"clients": args.warmup_clients, "seconds": args.warmup_seconds},
                   "client_procs": args.client_procs, "health_stall_ms": args.health_stall_ms,
                   "server_commands": {m: "python3 " + shlex.join(
                       server_command(args, m, "PORT")[1:]) for m in modes},
                   "server": server_info, "engine_batch1": engine_info,
                   "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}},
        "warmup": warmups,
        "levels": [strip(lv) for lv in levels],
        **({"rounds": [strip(x) for x in runs]} if args.rounds > 1 else {}),
        "engine_batch1": b1,
        "http_1_client_over_engine": ratios,
        "targets": goals,
        "wall_s": round(time.monotonic() - t_begin, 1)}
    plot = args.plot or (str(args.json.with_suffix(".png")) if args.json else "none")
    if plot != "none":
        result["plot"] = try_draw(Path(plot), result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    serve_report.table(levels, ratios, goals)
    return 0 if all(x["errors"] == 0 for x in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
