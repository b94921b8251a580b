"""One backend option off against on, in graph replays on the GPU: what attention_fork.py
and decode_order.py share. Per round and case, each setting's replay time (``replays``
back to back after the capture, capacity_classes.timed_replays), the settings' order
alternating by round, and the ratio on over off per round; both settings must give the same
logits bit for bit every round (the options compared move no arithmetic)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

import numpy as np
from capacity_classes import timed_replays
from common import stat, write_json


def option_ab(runner: Any, cases: dict[str, tuple[Any, Callable[[], int]]], field: str,
              labels: tuple[str, str], rounds: int, replays: int,
              before: Callable[[], None] | None = None) -> dict[str, dict[str, Any]]:
    """``cases``: name -> (step, the replay counter its graphs advance). ``field``: the
    BackendOptions switch, False under labels[0] and True under labels[1]; ``before`` runs
    ahead of each setting's replays (e.g. dropping graphs captured under the other).
    Returns per case the medians and min-max of "<label>_ms" and "<on>_over_<off>"."""
    be = runner.backend
    off, on = labels
    ratio = f"{on}_over_{off}"
    res: dict[str, dict[str, list[float]]] = {}
    opts = be.options
    try:
        for r in range(rounds):
            for name, (batch, count) in cases.items():
                got, d = {}, res.setdefault(name, {})
                for label in labels if r % 2 == 0 else labels[::-1]:
                    if before is not None:
                        before()
                    be.options = dataclasses.replace(opts, **{field: label == on})
                    ms, logits = timed_replays(lambda b=batch: runner.forward_device(b),
                                               replays, count)
                    got[label] = logits.view(np.uint32).tobytes()
                    d.setdefault(label + "_ms", []).append(ms)
                if len(set(got.values())) != 1:
                    raise SystemExit(f"{name}: the logits under {off} and {on} differ")
                d.setdefault(ratio, []).append(d[on + "_ms"][-1] / d[off + "_ms"][-1])
            print(f"round {r} done", file=sys.stderr, flush=True)
    finally:
        be.options = opts
    summary = {n: {k: stat(v) for k, v in d.items()} for n, d in res.items()}
    for n, d in summary.items():
        f = d[ratio]
        print(f"{n}: {off} {d[off + '_ms']['median']:.2f} ms, {on} x{f['median']:.3f} "
              f"[{f['min']:.3f}-{f['max']:.3f}]", file=sys.stderr)
    return summary


def write(script: str, argv: list[str] | None, path: str, summary: dict) -> None:
    """The JSON every such bench writes: its command, and the per-case summary."""
    write_json(path, {"command": f"python3 bench/{script} "
                      + " ".join(argv if argv is not None else sys.argv[1:]),
                      "logits_identical": True, "results": summary})
