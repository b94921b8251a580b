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

from capacity_classes import CASES as CLASS_CASES
from capacity_classes import chat_steps
from option_ab import option_ab, write

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
    mg = runner.backend.mixed_graphs
    cases = {name: (b, lambda: mg.num_replays) for name, b in batches.items()}
    # Each setting captures its graph afresh: the fork is read while a graph is captured.
    summary = option_ab(runner, cases, "attention_fork", RULES, args.rounds, args.replays,
                        before=mg.clear)
    write("attention_fork.py", argv, args.json, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
