"""Load generator for ``llm-engine serve``: named workloads, sustained/overload runs and a
scheduling-policy sweep, reported as JSON (+ PNG plots).

    python bench/serve.py --model tiny-random --out docs/serving/cpu-tiny.json
    python bench/serve.py --model smollm2-135m-instruct --profile small --out ...
    python bench/serve.py --url http://127.0.0.1:8000 --model NAME --suite workloads

Without --url each configuration gets its own server process (``python -m
crucible.cli_serve``) on a free loopback port, so the client never shares a GIL with the
engine. Latencies are client-side; queue peak and pages in use come from /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import serve_plot  # noqa: E402
from serve_workloads import (Arrival, burst, long_arrival, mixed, play, poisson,  # noqa: E402
                             report)

REPO = Path(__file__).resolve().parent.parent
# name -> arrivals; "full" suits the tiny model on CPU or a real model on a GPU, "small" the
# default model on CPU (~7 tokens/s single stream).
PROFILES: dict[str, dict[str, list[Arrival]]] = {
    "full": {
        "short-8": burst(8, 32, 32), "short-16": burst(16, 32, 32),
        "long-4x256": burst(4, 256, 32), "long-4x512": burst(4, 512, 32),
        "long-4x941": burst(4, 941, 32), "long-8x512": burst(8, 512, 32),
        "mixed-16": mixed(16, 8.0, 32, seed=1),
        "long-arrival": long_arrival(4, 160, 941, 0.5),
    },
    "small": {
        "short-4": burst(4, 32, 16), "long-2x256": burst(2, 256, 8),
        "long-arrival": long_arrival(2, 40, 256, 2.0),
    },
}
SWEEP_WORKLOADS = ("short-16", "long-8x512", "mixed-16", "long-arrival")


class Server:
    """A server subprocess on a free loopback port (or an external URL)."""

    def __init__(self, args: argparse.Namespace, **overrides: Any) -> None:
        self.proc: subprocess.Popen | None = None
        if args.url:
            self.url = args.url.rstrip("/")
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        opts = {"model": args.model, "device": args.device, "weights": args.weights,
                "num_pages": args.num_pages, "max_queue": args.max_queue,
                "token_budget": 1024, "chunk_cap": None, **overrides}
        cmd = [sys.executable, "-m", "crucible.cli_serve", "--port", str(port),
               "--log-level", "warning"]
        for k, v in opts.items():
            if v is not None:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.options = opts
        self.proc = subprocess.Popen(cmd, env=env, cwd=REPO)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {cmd}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("server did not become healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run(url: str, model: str, arrivals: list[Arrival]) -> tuple[dict, list]:
    results, server = asyncio.run(play(url, model, arrivals))
    return report(results, server), results


def warm_up(url: str, model: str) -> None:
    run(url, model, burst(2, 16, 4))  # first-request costs stay out of the figures


def suite_workloads(args: argparse.Namespace, out: dict) -> None:
    srv = Server(args)
    try:
        warm_up(srv.url, args.served)
        for name, arrivals in PROFILES[args.profile].items():
            rep, results = run(srv.url, args.served, arrivals)
            out["workloads"][name] = rep
            out["_cdf"][name] = [r.ttft * 1e3 for r in results if r.ok and r.ttft]
            print(f"{name:14s} ttft p50 {rep['ttft_ms']['median']:.1f} ms  "
                  f"tok/s {rep['output_throughput_tok_s']:.1f}  failures {rep['failures']}",
                  flush=True)
    finally:
        srv.stop()


def suite_load(args: argparse.Namespace, out: dict) -> None:
    """Sustained (below capacity) and overload (far above it) Poisson runs."""
    for name, rate in (("sustained", args.sustained_rate), ("overload", args.overload_rate)):
        srv = Server(args, **({"num_pages": args.overload_pages} if name == "overload" else {}))
        try:
            warm_up(srv.url, args.served)
            arrivals = poisson(rate, args.duration, 64, args.load_out, seed=7,
                               disconnect_frac=0.05)
            rep, results = run(srv.url, args.served, arrivals)
            rep["offered_rate_rps"] = rate
            rep["offered_duration_s"] = args.duration
            out["load"][name] = rep
            out["_tput"][name] = [t for r in results for t in r.chunk_times]
            print(f"{name:10s} {rep['requests']} sent, {rep['completed']} done, "
                  f"{rep['rejected_429']} x 429, {rep['intentional_disconnects']} hang-ups, "
                  f"failures {rep['failures']}, queue peak {rep['server']['queue_peak_polled']}"
                  f", pages back {rep['server']['all_pages_returned']}", flush=True)
        finally:
            srv.stop()


def _key_metrics(rep: dict) -> dict[str, float | None]:
    m = {"ttft_p50_ms": rep["ttft_ms"]["median"], "ttft_p95_ms": rep["ttft_ms"]["p95"],
         "e2e_p50_ms": rep["e2e_ms"]["median"], "tok_s": rep["output_throughput_tok_s"]}
    if "long_arrival" in rep:
        m["arrival_ttft_ms"] = rep["long_arrival"]["arrival_ttft_ms"]
        m["worst_decode_gap_ms"] = rep["long_arrival"]["worst_decode_gap_ms"]
    return m


def suite_sweep(args: argparse.Namespace, out: dict) -> None:
    configs = [(b, c) for b in (1024, 512, 256) for c in (None, 256, 128, 64)]
    raw: dict[str, dict[str, list[dict]]] = {}
    for rnd in range(args.rounds):
        order = configs if rnd % 2 == 0 else configs[::-1]  # alternate to spread drift
        for budget, cap in order:
            label = f"budget={budget},cap={cap or 'off'}"
            srv = Server(args, token_budget=budget, chunk_cap=cap)
            try:
                warm_up(srv.url, args.served)
                for name in SWEEP_WORKLOADS:
                    rep, _ = run(srv.url, args.served, PROFILES["full"][name])
                    raw.setdefault(label, {}).setdefault(name, []).append(_key_metrics(rep))
            finally:
                srv.stop()
            print(f"sweep round {rnd} {label} done", flush=True)
    base = "budget=1024,cap=off"
    summary: dict[str, dict] = {}
    for label, per in raw.items():
        summary[label] = {}
        for name, rounds in per.items():
            med = {k: statistics.median(r[k] for r in rounds if r[k] is not None)
                   for k in rounds[0] if any(r[k] is not None for r in rounds)}
            ref = {k: statistics.median(r[k] for r in raw[base][name] if r[k] is not None)
                   for k in med}
            summary[label][name] = {"median": med, "change_vs_default_pct": {
                k: round(100.0 * (v - ref[k]) / ref[k], 1) if ref[k] else None
                for k, v in med.items()}}
    out["sweep"] = {"default": base, "rounds": args.rounds, "summary": summary, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="use a running server (no sweep)")
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device", default="cpu")
    p.add_argument("--weights", default="int8")
    p.add_argument("--num-pages", type=int, default=1024)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--profile", choices=sorted(PROFILES), default="full")
    p.add_argument("--suite", nargs="+", default=["workloads", "load", "sweep"],
                   choices=["workloads", "load", "sweep"])
    p.add_argument("--sustained-rate", type=float, default=10.0, help="requests/s")
    p.add_argument("--overload-rate", type=float, default=200.0, help="requests/s")
    p.add_argument("--overload-pages", type=int, default=256,
                   help="smaller pool for the overload run, so the waiting queue fills")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    p.add_argument("--load-out", type=int, default=32, help="output tokens per load request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results/serve.json"))
    args = p.parse_args(argv)
    args.served = args.model
    out: dict[str, Any] = {"command": " ".join(["python", "bench/serve.py", *(argv or
                                                                            sys.argv[1:])]),
                           "model": args.model, "device": args.device, "weights": args.weights,
                           "num_pages": args.num_pages, "max_queue": args.max_queue,
                           "cpu_count": os.cpu_count(), "started": time.strftime(
                               "%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "workloads": {}, "load": {}, "_cdf": {}, "_tput": {}}
    if "workloads" in args.suite:
        suite_workloads(args, out)
    if "load" in args.suite:
        suite_load(args, out)
    if "sweep" in args.suite and not args.url:
        suite_sweep(args, out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    stem = args.out.with_suffix("")
    plots = []
    if out["_cdf"]:
        plots.append(serve_plot.plot(Path(f"{stem}-ttft-cdf.png"),
                                     {k: serve_plot.cdf(v) for k, v in out["_cdf"].items()},
                                     "TTFT CDF by workload", "TTFT (ms)", "fraction"))
    if out["_tput"]:
        plots.append(serve_plot.plot(Path(f"{stem}-throughput.png"),
                                     {k: serve_plot.throughput_over_time(v)
                                      for k, v in out["_tput"].items()},
                                     "Output tokens/s over time", "time (s)", "tokens/s"))
    out["plots"] = plots
    for k in ("_cdf", "_tput"):
        del out[k]
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
