"""The servers bench/serve_clients.py measures: their command line, their start on free
ports (ready when ``/health`` answers), their stop. One per engine mode: the engine in a
process of its own (``serve``'s default) or in the server's process."""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 900  # a first CUDA start compiles kernels


def server_command(args: argparse.Namespace, mode: str, port: int | str) -> list[str]:
    cmd = [sys.executable, "-m", "crucible.cli_serve", "--port", str(port), "--model",
           args.model, "--device", args.device, "--weights", args.weights,
           "--max-queue", str(args.max_queue), "--log-level", args.server_log_level]
    for flag in ("num_pages", "gpu_memory_fraction", "token_budget", "chunk_cap",
                 "max_running"):
        if getattr(args, flag) is not None:
            cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if mode == "in-process":
        return cmd + ["--engine-in-process"]
    given = args.api_servers is not None
    return cmd + (["--api-servers", str(args.api_servers)] if given else [])


def start_servers(args: argparse.Namespace, modes: list[str]) -> dict[str, tuple]:
    """A server per mode, each on its own free port, ready: {mode: (url, process)}.

    The ports are taken together (closed one at a time, the OS may hand the same free
    port out twice), and a server that exits before it is ready (its port taken meanwhile
    by another program's connection) is started again on another, at most twice."""
    servers: dict[str, tuple] = {}
    socks = [socket.socket() for _ in modes]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        ports = [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    try:
        for mode, port in zip(modes, ports):
            servers[mode] = _launch(args, mode, port)
        for mode in modes:
            for attempt in range(3):
                url, proc = servers[mode]
                try:
                    asyncio.run(wait_ready(url, proc))
                    break
                except RuntimeError:
                    if attempt == 2 or proc.returncode is None:
                        raise
                    with socket.socket() as sock:
                        sock.bind(("127.0.0.1", 0))
                        servers[mode] = _launch(args, mode, sock.getsockname()[1])
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def _launch(args: argparse.Namespace, mode: str, port: int) -> tuple[str, subprocess.Popen]:
    return f"http://127.0.0.1:{port}", subprocess.Popen(server_command(args, mode, port),
                                                        cwd=REPO)


def stop_servers(servers: dict[str, tuple]) -> None:
    for _, proc in servers.values():
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_ready(url: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode}")
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the server did not become ready")


