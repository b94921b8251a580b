"""Many concurrent streaming HTTP clients against one server: tok/s, TTFT and inter-token
gaps as clients are added, and errors (there must be none).

    python3 bench/serve_clients.py --model tiny-random --device cpu --clients 1,16,64,256 \
        --json bench/serve-clients-cpu-tiny.json

The server runs in its own process (``python -m crucible.cli_serve``) on a free loopback
port, so the clients never share its GIL. Each client streams ``/v1/completions`` requests
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
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    port = free_port()
    cmd = [sys.executable, "-m", "crucible.cli_serve", "--port", str(port), "--model",
           args.model, "--device", args.device, "--max-queue", str(args.max_queue),
           "--log-level", "warning"]
    if args.num_pages:
        cmd += ["--num-pages", str(args.num_pages)]
    server = subprocess.Popen(cmd, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url))
        levels = [asyncio.run(one_level(url, args.model, int(c), args.seconds, 1000 * i))
                  for i, c in enumerate(args.clients.split(","))]
    finally:
        server.terminate()
        server.wait(30)
    result = {"command": "python3 " + " ".join(sys.argv), "levels": levels}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'clients':>8} {'tok/s':>9} {'ttft p50':>9} {'gap p50':>8} {'gap p99':>8} "
          f"{'health max':>10} {'errors':>6}")
    for lv in levels:
        print(f"{lv['clients']:>8} {lv['tok_per_s']:>9} {lv['ttft_p50_ms']!s:>9} "
              f"{lv['gap_p50_ms']!s:>8} {lv['gap_p99_ms']!s:>8} {lv['health_max_ms']:>10} "
              f"{lv['errors']:>6}")
    return 0 if all(lv["errors"] == 0 for lv in levels) else 1


if __name__ == "__main__":
    raise SystemExit(main())
