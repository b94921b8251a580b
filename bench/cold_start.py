"""A GPU start with empty kernel caches, this tree against another, in fresh processes.

    python3 bench/cold_start.py --model PATH --base TREE [--rounds 2] [--json PATH]

Each run is a new process that builds ``LLM(model, device="cuda")`` (the engine's own
start-up: weights up, pool sized, decode graphs captured) and generates a few greedy
replies with logprobs. Before each cold run CuPy's kernel cache (``CUPY_CACHE_DIR``) and
ours (``~/.cache/crucible/kernels``, through ``HOME``) point at new empty directories, so
every NVRTC build happens in the run, as on a fresh install; the prepared model is shared
(``CRUCIBLE_CACHE``), so only the kernel builds differ. A warm run follows each cold one
with the same caches. Trees alternate A B B A by round (A = ``--base``, B = this tree).

``--serve``: each run is ``llm-engine serve`` instead, timed to its first ``/health`` 200 and
then one greedy completion, whose text must agree across runs.

Reported per tree: seconds to ``LLM`` ready and to the end, cold and warm, medians and
min-max; the replies' ids and logprobs (as float32 bits) must agree across every run of
both trees, or the script exits non-zero: splitting a module into several NVRTC programs
and building them on threads must not change a bit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import socket
import tempfile
import time
import urllib.request
from pathlib import Path

from common import stat, write_json

HERE = Path(__file__).resolve().parent
CHILD = r"""
import dataclasses, json, struct, sys, time
t0 = time.perf_counter()
from crucible import LLM, SamplingParams
model = sys.argv[1]
if model == "random":  # the default model's shapes, random weights, prepared before t0
    sys.path.insert(0, sys.argv[3])
    from common import SMOLLM2
    from crucible.model.tiny import tiny_random_model
    m = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    model = dataclasses.replace(m, prepared=m.backend_tensors())
    t0 = time.perf_counter()
llm = LLM(model, device=sys.argv[2])
ready = time.perf_counter() - t0
prompts = ["The capital of France is", "Write a haiku about the sea.", [1, 2, 3, 4, 5]]
outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, logprobs=2))
bits = [[sorted((k, struct.unpack("<I", struct.pack("<f", v))[0]) for k, v in lp.items())
         for lp in o.logprobs] for o in outs]
print(json.dumps({"ready_s": ready, "total_s": time.perf_counter() - t0,
                  "ids": [list(o.token_ids) for o in outs], "bits": bits}))
"""


def tree_env(tree: Path, cache_env: dict[str, str]) -> dict[str, str]:
    """The environment of a run of ``tree``: its caches, and the tree first on the path."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, **cache_env, PYTHONPATH=os.pathsep.join([str(tree)] + rest))


def run(tree: Path, model: str, device: str, cache_env: dict[str, str]) -> dict:
    env = tree_env(tree, cache_env)
    done = subprocess.run([sys.executable, "-c", CHILD, model, device, str(HERE)], env=env,
                          cwd=tree,
                          capture_output=True, text=True, timeout=590)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = [ln for ln in done.stderr.splitlines() if "crucible:" in ln][-4:]
    return out


def run_serve(tree: Path, model: str, device: str, cache_env: dict[str, str]) -> dict:
    """``llm-engine serve`` in a fresh process: seconds until ``/health`` answers 200, then
    one greedy completion (its text stands in for the ids: the server's own check)."""
    env = tree_env(tree, cache_env)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "crucible", "serve", "--model", model,
                             "--device", device, "--port", str(port)], env=env, cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{tree}: the server exited {proc.returncode}: "
                                 f"{proc.stderr.read()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:  # refused while it starts, 503 while the engine loads
                pass
            if time.perf_counter() - t0 > 500:
                raise SystemExit(f"{tree}: no /health in 500 s")
            time.sleep(0.1)
        ready = time.perf_counter() - t0
        body = json.dumps({"model": model, "prompt": "The capital of France is",
                           "max_tokens": 16, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            text = json.load(r)["choices"][0]["text"]
        return {"ready_s": ready, "total_s": time.perf_counter() - t0, "ids": text, "bits": [],
                "stderr": []}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True,
                   help="a GGUF path, or 'random': the default model's shapes with random "
                        "weights (no upload of the model to a GPU host; LLM timed from "
                        "the prepared weights)")
    p.add_argument("--base", required=True, help="the baseline tree (A)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    p.add_argument("--serve", action="store_true",
                   help="time `llm-engine serve` to its first /health 200 instead of LLM")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    trees = {"A": Path(args.base).resolve(), "B": HERE.parent}
    prepared = tempfile.mkdtemp(prefix="crucible-prepared-")
    # The prepared model first (on the CPU), so no timed run pays for writing it.
    if args.model != "random":
        subprocess.run([sys.executable, "-c", "import sys; from crucible import LLM; "
                        "LLM(sys.argv[1], device='cpu')", args.model], check=True,
                       cwd=HERE.parent, env=dict(os.environ, CRUCIBLE_CACHE=prepared),
                       timeout=300)
    runs: dict[str, dict[str, list]] = {t: {"cold": [], "warm": []} for t in trees}
    reference = None
    for r in range(args.rounds):
        for t in ("A", "B") if r % 2 == 0 else ("B", "A"):
            home, cupy_cache = tempfile.mkdtemp(), tempfile.mkdtemp()
            cache_env = {"HOME": home, "CUPY_CACHE_DIR": cupy_cache, "CRUCIBLE_CACHE": prepared}
            for kind in ("cold", "warm"):
                got = (run_serve if args.serve else run)(trees[t], args.model, args.device,
                                                         cache_env)
                key = (got["ids"], got["bits"])
                reference = reference or key
                got["same_as_first"] = key == reference
                runs[t][kind].append({k: got[k] for k in ("ready_s", "total_s", "stderr",
                                                           "same_as_first")})
                print(f"round {r} {t} {kind}: ready {got['ready_s']:.1f} s, total "
                      f"{got['total_s']:.1f} s, same bits {got['same_as_first']}", flush=True)
    summary = {t: {kind: {m: stat([x[m] for x in runs[t][kind]]) for m in ("ready_s", "total_s")}
                   for kind in ("cold", "warm")} for t in trees}
    same = all(x["same_as_first"] for t in runs.values() for k in t.values() for x in k)
    print(json.dumps(summary, indent=1))
    print(f"replies identical in every run: {same}")
    if args.json:
        command = "python3 bench/cold_start.py " + " ".join(argv or sys.argv[1:])
        write_json(args.json, {"command": command,
                               "trees": {t: str(v) for t, v in trees.items()},
                               "summary": summary, "identical": same, "runs": runs})
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
