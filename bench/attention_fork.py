"""A mixed step's two attention launches on two streams (backend/cupy_fork.py) against one
stream, in mixed-graph replays on the GPU (random weights of the default model's shapes, so
no model file is needed).

    python3 bench/attention_fork.py [--rounds 3] [--replays 20] [--json PATH]

Cases: capacity_classes.py's chat steps (cohorts and joiners late in their conversations,
one of 256 running requests) and the serving sweep's chat window at 256 clients
(bench/serve-sweep-chat-a7601b9-h100.json: ~250 decode rows beside ~600 prompt tokens a
step, new prompts from position 0 or a long prompt's later slice). Per case each rule
("one" stream, "fork") captures its graph afresh, then ``--replays`` replays run back to
back; the rules' order alternates by round and the ratio is fork over one per round. Both
must give the same logits bit for bit, every round (the fork moves no arithmetic).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
from capacity_classes import CASES as CLASS_CASES
from capacity_classes import chat_steps, replay_ms
from common import stat, write_json

CASES = CLASS_CASES + (
    ("serve chat 256: 250 decode at 300-2,500 + prompts 300/200/110", 250, (300, 2500),
     (300, 200, 110), (0, 0)),
    ("serve chat 256: 250 decode at 300-2,500 + one prompt of 600", 250, (300, 2500),
     (600,), (0, 0)),
    ("serve chat 256: 250 decode at 300-2,500 + a 600 slice at ~1,024", 250, (300, 2500),
     (600,), (1000, 1050)),
    ("serve chat 64: 62 decode at 300-2,500 + prompts 300/200", 62, (300, 2500),
     (300, 200), (0, 0)),
)
RULES = ("one", "fork")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", default="bench/attention-fork.json")
    args = p.parse_args(argv)
    runner, batches = chat_steps(CASES)
    be = runner.backend
    mg, opts = be.mixed_graphs, be.options
    res: dict[str, dict[str, list[float]]] = {}
    try:
        for r in range(args.rounds):
            for name, batch in batches.items():
                got, d = {}, res.setdefault(name, {})
                for rule in RULES if r % 2 == 0 else RULES[::-1]:
                    mg.clear()  # captured afresh under this rule
                    # read while the graph is captured
                    be.options = dataclasses.replace(opts, attention_fork=rule == "fork")
                    ms, logits, _ = replay_ms(runner, batch, args.replays)
                    got[rule] = logits.view(np.uint32).tobytes()
                    d.setdefault(rule + "_ms", []).append(ms)
                if len(set(got.values())) != 1:
                    raise SystemExit(f"{name}: forked logits differ from one stream's")
                d.setdefault("fork_over_one", []).append(d["fork_ms"][-1] / d["one_ms"][-1])
            print(f"round {r} done", file=sys.stderr, flush=True)
    finally:
        be.options = opts
    summary = {n: {k: stat(v) for k, v in d.items()} for n, d in res.items()}
    for n, d in summary.items():
        f = d["fork_over_one"]
        print(f"{n}: one {d['one_ms']['median']:.2f} ms, fork x{f['median']:.3f} "
              f"[{f['min']:.3f}-{f['max']:.3f}]", file=sys.stderr)
    write_json(args.json, {"command": "python3 bench/attention_fork.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                           "logits_identical": True, "results": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
