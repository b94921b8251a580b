"""The HTTP front's own capacity, with the engine taken out of the picture.

    python3 bench/front_capacity.py --clients 64,256,512 --rates 10000,20000,30000,60000 \
        --seconds 5 --against HEAD~1 --json bench/front-capacity-cpu.json

The real front (crucible/server: aiohttp, tokenising, detokenising, JSON, SSE, the engine
client and its reader thread) runs as ``llm-engine serve`` runs it, against an engine
process that is the real core loop and wire around a fake engine (front_core_stub.py): every
step gives each running request one new id (a real tokenizer's ids of real text) and the
step rate is set so the offered rate is ``--rates`` tokens/s over all clients. Clients
(front_clients.py, a process of their own, so they never share the front's GIL) stream
``/v1/completions`` back to back, one SSE chunk per token. For every point: the chunks/s
the clients got, the front process's CPU time (user + system, all its threads) per chunk,
the client-side gaps between chunks of a stream (p50/p99) and TTFT, and the CPU shares of
the front, the fake engine and the clients, which show who the limit was.

Placement: the front is pinned to ``--front-cpu`` and the fake engine and clients share
``--other-cpus``, so the front has a core of its own as on a big GPU host. An offered rate
above what the front can serve saturates it: then chunks/s is its capacity on that core.
``--against REV`` measures the same points on REV's tree too (a git worktree: its front,
this tree's stub and clients), alternating which goes first; ``--this REV`` measures REV
instead of the working tree. ``--profile DIR``: cProfile the front (front_server.py).
"""

from __future__ import annotations

import argparse
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

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, every thread included (dead ones too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy (not idle or waiting), from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / TICK


def engine_pid(front: int) -> int:
    """The front's engine process (not multiprocessing's resource tracker)."""
    for task in Path(f"/proc/{front}/task").iterdir():
        for c in (task / "children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                return int(c)
    raise RuntimeError("the front has no engine process")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_tokenizer() -> str:
    cache = Path(os.environ.get("CRUCIBLE_CACHE", Path.home() / ".cache" / "crucible"))
    return ("smollm2-135m-instruct" if any((cache / "smollm2-135m-instruct").glob("*.gguf"))
            else "tiny-random")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(q * len(v) + 0.999999) - 1))]


# -- one measured point -------------------------------------------------------------------

def wait_health(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the front exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the front did not become ready")


def measure(args: argparse.Namespace, tree: Path, clients: int, rate: float,
            log_path: Path) -> dict:
    port = free_port()
    step_rate = rate / clients
    sys.path.insert(0, str(BENCH))
    from front_core_stub import spec_json  # noqa: E402 - this tree's stub, any front

    spec = spec_json(args.tokenizer, step_rate)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(BENCH)]))
    with open(log_path, "ab") as log:
        front = subprocess.Popen(
            [sys.executable, str(BENCH / "front_server.py"), "--port", str(port), "--spec",
             spec, "--max-queue", str(4 * clients + 64)]
            + (["--profile", args.profile] if args.profile else []),
            cwd=tree, env=env, stdout=log, stderr=log,
            preexec_fn=lambda: os.sched_setaffinity(0, args.front_cpu))
    try:
        wait_health(port, front)
        core = engine_pid(front.pid)
        for task in Path(f"/proc/{core}/task").iterdir():  # spawned on the front's core
            os.sched_setaffinity(int(task.name), args.other_cpus)
        t0 = time.monotonic() + args.warmup
        t1 = t0 + args.seconds
        cl = subprocess.Popen(
            [sys.executable, str(BENCH / "front_clients.py"), "--port", str(port),
             "--clients", str(clients), "--t0", repr(t0), "--t1", repr(t1),
             "--max-tokens", args.max_tokens],
            stdout=subprocess.PIPE, preexec_fn=lambda: os.sched_setaffinity(0, args.other_cpus))
        pids = {"front": front.pid, "core": core, "clients": cl.pid}
        time.sleep(max(0.0, t0 - time.monotonic()))
        before, busy0 = {k: cpu_s(p) for k, p in pids.items()}, machine_busy_s()
        time.sleep(max(0.0, t1 - time.monotonic()))
        after, busy1 = {k: cpu_s(p) for k, p in pids.items()}, machine_busy_s()
        out, _ = cl.communicate(timeout=120)
        got = json.loads(out)
    finally:
        front.send_signal(signal.SIGTERM)
        try:
            front.wait(30)
        except subprocess.TimeoutExpired:
            front.kill()
            front.wait()
    span = t1 - t0
    chunks = got["chunks"]
    used = {k: sum(after[k]) - sum(before[k]) for k in pids}
    sys_share = {k: round((after[k][1] - before[k][1]) / span, 3) for k in pids}
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    return {"clients": clients, "offered_tok_s": rate, "step_rate": round(step_rate, 2),
            "chunks_per_s": round(chunks / span, 1), "requests": got["requests"],
            "front_cpu_us_per_request": round(used["front"] / got["requests"] * 1e6, 1)
            if got["requests"] else None,
            "errors": got["errors"],
            "front_cpu_us_per_chunk": round(used["front"] / chunks * 1e6, 2) if chunks else None,
            "cpu_share": {k: round(v / span, 3) for k, v in used.items()},
            "system_cpu_share": sys_share,
            # Whatever else ran on the machine meanwhile (other jobs share these cores).
            "others_cpu_share": round((busy1 - busy0 - sum(used.values())) / span, 3),
            "gap_p50_ms": ms(pct(got["gaps"], 0.5)), "gap_p99_ms": ms(pct(got["gaps"], 0.99)),
            "ttft_p50_ms": ms(pct(got["ttft"], 0.5)), "ttft_p99_ms": ms(pct(got["ttft"], 0.99))}


def worktree(rev: str, made: list[Path]) -> tuple[Path, str]:
    """A checkout of ``rev`` under /tmp (removed at the end if this run made it); a
    directory is taken as it is (a tree holding ``crucible/``, e.g. one with some files
    of another revision, to single a change out)."""
    if Path(rev, "crucible").is_dir():
        return Path(rev).resolve(), f"directory {Path(rev).resolve()}"
    sha = subprocess.run(["git", "rev-parse", rev], cwd=REPO, check=True, text=True,
                         capture_output=True).stdout.strip()
    path = Path(f"/tmp/front-capacity-{sha[:12]}")
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO,
                       check=True, capture_output=True)
        made.append(path)
    return path, sha


def summary(runs: list[dict]) -> dict:
    """Medians over rounds of the figures the docs quote."""
    keys = ("chunks_per_s", "front_cpu_us_per_chunk", "front_cpu_us_per_request",
            "gap_p50_ms", "gap_p99_ms", "ttft_p50_ms")
    out = {k: statistics.median(r[k] for r in runs if r[k] is not None)
           if any(r[k] is not None for r in runs) else None for k in keys}
    out["front_cpu_share"] = statistics.median(r["cpu_share"]["front"] for r in runs)
    out["others_cpu_share"] = statistics.median(r["others_cpu_share"] for r in runs)
    out["errors"] = sum(r["errors"] for r in runs)
    return out


def main(args: argparse.Namespace) -> None:
    made: list[Path] = []
    try:
        run_points(args, made)
    finally:
        for path in made:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO,
                           capture_output=True)


def run_points(args: argparse.Namespace, made: list[Path]) -> None:
    if args.this:
        trees = {"this": worktree(args.this, made)}
    else:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, text=True,
                              capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "crucible"], cwd=REPO,
                               text=True, capture_output=True).stdout.strip()
        trees = {"this": (REPO, head + (" + uncommitted changes" if dirty else ""))}
    if args.against:
        trees["against"] = worktree(args.against, made)
    log_path = Path(args.log)
    points, order = [], list(trees)
    for clients in args.clients:
        for rate in args.rates:
            runs: dict[str, list[dict]] = {k: [] for k in trees}
            for _ in range(args.rounds):
                for name in order:
                    # On a shared machine, a point during which other jobs took more than
                    # --max-others of a core is measured again, a few seconds later.
                    for attempt in range(args.retries + 1):
                        r = measure(args, trees[name][0], clients, rate, log_path)
                        r["attempt"] = attempt
                        if r["others_cpu_share"] <= args.max_others:
                            break
                        time.sleep(args.retry_wait)
                    runs[name].append(r)
                    print(f"{name:8s} clients={clients:4d} offered={rate:7.0f} "
                          f"chunks/s={r['chunks_per_s']:8.0f} "
                          f"cpu/chunk={r['front_cpu_us_per_chunk']} us "
                          f"gap p50/p99={r['gap_p50_ms']}/{r['gap_p99_ms']} ms "
                          f"share={r['cpu_share']} others={r['others_cpu_share']} "
                          f"errors={r['errors']}", flush=True)
                order.reverse()  # alternate which tree goes first
            points.append({"clients": clients, "offered_tok_s": rate,
                           **{name: {"median": summary(rs), "runs": rs}
                              for name, rs in runs.items()}})
    result = {"command": "python3 " + " ".join(sys.argv), "tokenizer": args.tokenizer,
              "trees": {k: v[1] for k, v in trees.items()},
              "placement": {"cpus": os.cpu_count(), "front": sorted(args.front_cpu),
                            "fake_engine_and_clients": sorted(args.other_cpus)},
              "loadavg": os.getloadavg(), "seconds": args.seconds, "warmup": args.warmup,
              "rounds": args.rounds, "max_others": args.max_others, "retries": args.retries,
              "points": points}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps([{"clients": p["clients"], "offered_tok_s": p["offered_tok_s"]}
                      | {n: p[n]["median"] for n in trees} for p in points], indent=2))


def cpus(text: str) -> set[int]:
    return {int(c) for c in text.split(",")}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")],
                   default=[64, 256, 512])
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")],
                   default=[10000.0, 20000.0, 30000.0, 60000.0],
                   help="offered tokens/s over all clients")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-tokens", default="32,96", help="LO,HI per request (clients draw)")
    p.add_argument("--tokenizer", default=None, help="model whose tokenizer the ids use")
    p.add_argument("--this", default=None,
                   help="a git revision to measure instead of the working tree")
    p.add_argument("--against", default=None,
                   help="a git revision (or a tree's directory) to measure as well")
    p.add_argument("--front-cpu", type=cpus, default={0})
    p.add_argument("--other-cpus", type=cpus, default=None)
    p.add_argument("--max-others", type=float, default=9.0,
                   help="measure a point again while other jobs used more CPUs than this")
    p.add_argument("--retries", type=int, default=0)
    p.add_argument("--retry-wait", type=float, default=5.0)
    p.add_argument("--json", default=None)
    p.add_argument("--log", default="/tmp/front-capacity.log")
    p.add_argument("--profile", default=None,
                   help="a folder: cProfile the front's loop and reader threads there")
    a = p.parse_args()
    a.tokenizer = a.tokenizer or default_tokenizer()
    if a.other_cpus is None:
        rest = set(os.sched_getaffinity(0)) - a.front_cpu
        a.other_cpus = rest or set(a.front_cpu)
    main(a)
