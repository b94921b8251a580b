"""Many concurrent streaming HTTP clients against one server: tok/s, TTFT and inter-token
gaps as clients are added, and errors (there must be none).

    python3 bench/serve_clients.py --model tiny-random --device cpu --clients 1,16,64,256 \
        --json bench/serve-clients-cpu-tiny.json

The server runs in its own process (``python -m crucible.cli_serve``) on a free loopback
port, so the clients never share its GIL; its engine runs in a process of its own too
unless ``--engine-in-process`` is given. ``--both-modes`` starts one server of each kind
and measures every client count on both, alternating which goes first, for an A/B on one
machine state; ``--rounds N`` measures every point N times and reports the medians. Each client streams ``/v1/completions`` requests
(a prompt of 20-200 random words, ``max_tokens`` 32-96, ``ignore_eos``, temperature 0.7)
back to back for ``--seconds``; a chunk counts as a token. ``/health`` is polled meanwhile
and its slowest answer is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput_measure import pct  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORDS = ("the cat sat on a mat while seven quick foxes ran past old river stones under "
         "grey autumn skies and nobody noticed").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the server did not become ready")


async def client(s: aiohttp.ClientSession, url: str, model: str, rng: random.Random,
                 stop_at: float, out: dict) -> None:
    while time.monotonic() < stop_at:
        body = {"model": model, "prompt": " ".join(rng.choices(WORDS, k=rng.randint(20, 200))),
                "max_tokens": rng.randint(32, 96), "temperature": 0.7, "stream": True,
                "ignore_eos": True}
        t0 = last = time.monotonic()
        first = True
        try:
            async with s.post(url + "/v1/completions", json=body) as r:
                if r.status != 200:
                    out["errors"] += 1
                    await r.read()
                    continue
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    now = time.monotonic()
                    if first:
                        out["ttft"].append(now - t0)
                        first = False
                    else:
                        out["gaps"].append(now - last)
                    last = now
                    out["tokens"] += 1
        except aiohttp.ClientError:
            out["errors"] += 1


async def health_probe(s: aiohttp.ClientSession, url: str, stop_at: float, out: dict) -> None:
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        async with s.get(url + "/health") as r:
            await r.read()
        out["health_max"] = max(out["health_max"], time.monotonic() - t0)
        await asyncio.sleep(0.1)


async def one_level(url: str, model: str, clients: int, seconds: float, seed: int) -> dict:
    out = {"tokens": 0, "errors": 0, "ttft": [], "gaps": [], "health_max": 0.0}
    conn = aiohttp.TCPConnector(limit=clients + 4)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        t0 = time.monotonic()
        stop_at = t0 + seconds
        await asyncio.gather(health_probe(s, url, stop_at, out),
                             *(client(s, url, model, random.Random(seed + i), stop_at, out)
                               for i in range(clients)))
        wall = time.monotonic() - t0
    ms = lambda xs, q: round(1000 * pct(xs, q), 2) if xs else None  # noqa: E731
    return {"clients": clients, "wall_s": round(wall, 2), "tokens": out["tokens"],
            "tok_per_s": round(out["tokens"] / wall, 1), "errors": out["errors"],
            "ttft_p50_ms": ms(out["ttft"], 0.5), "ttft_p99_ms": ms(out["ttft"], 0.99),
            "gap_p50_ms": ms(out["gaps"], 0.5), "gap_p99_ms": ms(out["gaps"], 0.99),
            "health_max_ms": round(1000 * out["health_max"], 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device", default="auto")
    p.add_argument("--clients", default="1,16,64,256")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--max-queue", type=int, default=1024)
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--engine-in-process", action="store_true",
                   help="pass --engine-in-process to the server (the engine in its thread)")
    p.add_argument("--both-modes", action="store_true",
                   help="measure the engine in its own process and in-process, alternating")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every point this many times and report medians")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    modes = (["process", "in-process"] if args.both_modes else
             ["in-process" if args.engine_in_process else "process"])
    servers = {m: start_server(args, m) for m in modes}
    runs = []
    try:
        for url, _ in servers.values():
            asyncio.run(wait_ready(url))
        k = 0
        for r in range(args.rounds):
            for i, c in enumerate(args.clients.split(",")):
                for m in (modes if k % 2 == 0 else modes[::-1]):  # alternate who goes first
                    lv = asyncio.run(one_level(servers[m][0], args.model, int(c),
                                               args.seconds, 1000 * i))
                    runs.append({"engine": m, "round": r, **lv})
                k += 1
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(30)
    levels = [median_level([x for x in runs if (x["engine"], x["clients"]) == key])
              for key in dict.fromkeys((x["engine"], x["clients"]) for x in runs)]
    levels.sort(key=lambda lv: (modes.index(lv["engine"]), lv["clients"]))
    result = {"command": "python3 " + " ".join(sys.argv), "levels": levels,
              **({"rounds": runs} if args.rounds > 1 else {})}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'engine':>10} {'clients':>8} {'tok/s':>9} {'ttft p50':>9} {'gap p50':>8} "
          f"{'gap p99':>8} {'health max':>10} {'errors':>6}")
    for lv in levels:
        print(f"{lv['engine']:>10} {lv['clients']:>8} {lv['tok_per_s']:>9} "
              f"{lv['ttft_p50_ms']!s:>9} {lv['gap_p50_ms']!s:>8} {lv['gap_p99_ms']!s:>8} "
              f"{lv['health_max_ms']:>10} {lv['errors']:>6}")
    return 0 if all(x["errors"] == 0 for x in runs) else 1


def median_level(rounds: list[dict]) -> dict:
    """One point from several rounds: each figure's median (errors summed). A shared
    machine's noise hits single rounds; the median of an odd count is one of them."""
    if len(rounds) == 1:
        return {k: v for k, v in rounds[0].items() if k != "round"}
    out = {"engine": rounds[0]["engine"], "clients": rounds[0]["clients"],
           "rounds": len(rounds), "errors": sum(x["errors"] for x in rounds)}
    for key in ("wall_s", "tokens", "tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "gap_p50_ms",
                "gap_p99_ms", "health_max_ms"):
        vals = [x[key] for x in rounds if x[key] is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def start_server(args: argparse.Namespace, mode: str) -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, "-m", "crucible.cli_serve", "--port", str(port), "--model",
           args.model, "--device", args.device, "--max-queue", str(args.max_queue),
           "--log-level", "warning"]
    if args.num_pages:
        cmd += ["--num-pages", str(args.num_pages)]
    if mode == "in-process":
        cmd.append("--engine-in-process")
    return f"http://127.0.0.1:{port}", subprocess.Popen(cmd, cwd=REPO)


if __name__ == "__main__":
    raise SystemExit(main())
