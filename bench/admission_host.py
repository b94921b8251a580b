"""Host time of a cached chat cohort's admission: the step that admits 16 next turns of
conversations the prefix cache holds, with instant kernels (bench/host_step.py's
``InstantRunner``), so only the engine's Python counts.

    python3 bench/admission_host.py [--rounds 5] [--cohorts 12] [--json PATH]

Why: on a GPU a chat cohort's turn arrives while a short decode step runs, and the device
then waits for the host to plan the cohort's step: matching ~100 cached pages a request,
taking them out of the free queue, validating a batch whose tables share the system
prompt's pages (bench/chat-timeline-*: ~2.8 ms on an H100 host before 2026-12-07, on the
critical path of every cached turn's time to first token).

Set-up (the prefix cache chat bench's shape, bench/prefix_chat.py): 64 conversations
behind a 500-token system prompt, four cohorts of 16 taking 8 turns of 60 new tokens and 64
generated ones (~1,550 tokens of history each), then 48 conversations decoding long. Timed
(process CPU time): ``--cohorts`` steps, each admitting the next turn of 16 conversations
(all but their last ~100 tokens cached), and as many plain decode steps beside them.
Before each admitting step, the cohort's 16 ``add_request`` calls are timed as the async
engine's worker makes them (``intake_ms``: ids its ``add`` built and checked, taken with
``checked=True``), every other cohort checked a second time as before that flag
(``intake_checked_again_ms``; a tree without the flag gives only this one). The same
cohorts time the event loop's side of the arrivals, ``AsyncLLMEngine.add``'s check and
conversion of each prompt: ``checked_ids`` (``arrival_ms``) and, every other cohort, the
check and ``map(int, ...)`` it replaced (``arrival_before_ms``).

Against another revision, fresh processes alternating (bench/env_ab.py; this script and
its helpers with either tree's ``crucible`` on the path):

    git archive REV crucible | tar -x -C /tmp/base   # plus its compiled crucible/backend/_cpu*
    python3 bench/env_ab.py --a PYTHONPATH=/tmp/base --b PYTHONPATH=$PWD --rounds 8 \
        --metric figures.admission_step_ms.median --metric figures.decode_step_ms.median \
        --json bench/admission-host-cpu.json -- python3 $PWD/bench/admission_host.py \
        --rounds 1 --json {json}
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np
from common import stat, write_json
from host_step import TEXT, InstantRunner

from crucible.engine.engine import LLMEngine
from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.request import TokenIds
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer

PAGES, USERS, COHORT = 16384, 64, 16
# Trees before ``checked_ids`` and add_request's ``checked`` (an A/B baseline) measure only
# the way before them.
CHECKED = hasattr(LLMEngine, "checked_ids")


def one_round(cohorts: int, seed: int) -> dict[str, float]:
    tok = tiny_tokenizer()
    rng = np.random.default_rng(seed)
    runner = InstantRunner(PAGES, TINY_VOCAB_SIZE, 8192, tok.encode(TEXT))
    runner.backend = SimpleNamespace(arithmetic="instant")
    eng = LLMEngine(runner, tok, SchedulerConfig(token_budget=1024, max_queue=256,
                                                 max_running=256),
                    prefix_cache=PrefixCache(("bench",), "instant", PAGES))
    eng.detokenize = False
    system = rng.integers(0, TINY_VOCAB_SIZE, 500).tolist()
    convs = [system + rng.integers(0, TINY_VOCAB_SIZE, 60).tolist() for _ in range(USERS)]
    reply = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)

    def turn(users: range) -> None:
        rids = {eng.add_request(convs[u], reply): u for u in users}
        outs: dict[str, list[int]] = {r: [] for r in rids}
        while any(r in eng.requests for r in rids):
            for d in eng.step():
                if d.request_id in outs:
                    outs[d.request_id] += d.new_token_ids
        for r, u in rids.items():
            convs[u] += outs[r] + rng.integers(0, TINY_VOCAB_SIZE, 60).tolist()

    for _ in range(8):
        for c in range(USERS // COHORT):
            turn(range(COHORT * c, COHORT * (c + 1)))
    long = SamplingParams(max_tokens=100_000 // 8, temperature=0.0, ignore_eos=True)
    for u in range(COHORT, USERS):
        eng.add_request(convs[u], long)
    for _ in range(4):
        eng.step()
    admit, decode, intake, arrival = [], [], {True: [], False: []}, {True: [], False: []}
    for k in range(cohorts):
        t = time.process_time()
        eng.step()
        decode.append(time.process_time() - t)
        # The same conversations, a token longer each time, taken in as the async engine's
        # worker takes them: TokenIds that add() built and checked on the loop. Every other
        # cohort is checked again (as before ``checked``) for the intake's A/B.
        raw = [convs[u] + [1] * (k + 1) for u in range(COHORT)]
        again = k % 2 == 1 or not CHECKED
        t = time.process_time()  # the loop's side: add() checks and converts each prompt
        if again:
            for one in raw:
                eng.check_request(one, reply)
            ids = [TokenIds(map(int, one)) for one in raw]
        else:
            ids = [eng.checked_ids(one, reply) for one in raw]
        arrival[again].append(time.process_time() - t)
        t = time.process_time()
        for one in ids:
            if again:
                eng.add_request(one, reply)
            else:
                eng.add_request(one, reply, checked=True)
        intake[again].append(time.process_time() - t)
        t = time.process_time()
        eng.step()  # plans (admits) the cohort's step
        admit.append(time.process_time() - t)
        while any(len(r.token_ids) < r.num_prompt_tokens + 64 for r in eng.requests.values()
                  if r.params.max_tokens == 64):
            eng.step()
    out = {"admission_step_ms": float(np.median(admit)) * 1e3,
           "decode_step_ms": float(np.median(decode)) * 1e3,
           "intake_checked_again_ms": float(np.median(intake[True])) * 1e3,
           "arrival_before_ms": float(np.median(arrival[True])) * 1e3}
    if CHECKED:
        out["intake_ms"] = float(np.median(intake[False])) * 1e3
        out["arrival_ms"] = float(np.median(arrival[False])) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cohorts", type=int, default=12)
    p.add_argument("--json", default="bench/admission-host-cpu.json")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    head = {"command": "python3 bench/admission_host.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "rounds": args.rounds,
        "cohorts": args.cohorts}
    res: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for k, v in one_round(args.cohorts, args.seed + r).items():
            res.setdefault(k, []).append(v)
    write_json(args.json, {**head, "figures": {k: stat(v) for k, v in res.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
