"""Mixed graphs keyed by capacity classes against powers of two, replayed on the GPU (random
weights of the default model's shapes, so no model file is needed).

    python3 bench/capacity_classes.py [--rounds 3] [--replays 20] [--json PATH]

A mixed graph bakes in each attention launch's score capacity, which sizes a CTA's shared
memory. Powers of two (the rule before kernels/capacity.py) gave slices ending at
1,025-2,048 positions C = 2,048, one CTA of the exact tiled kernel an SM, and decode rows
past 2,048 positions C = 4,096, two attn_decode CTAs an SM; the classes keep 2 and 3. The
cases are a chat server's steps late in its conversations (bench/chat_timeline.py's
cohorts and joiners, histories up to ~2,600 positions) and one of 256 running requests.
Rules: "classes" (occupancy classes, the plain attn_exact instance), "spread" (the spread
rule, off by default: one-wave grids as few CTAs an SM as they need), "powers", and
"prefetch" (the classes with attn_exact's prefetching instance, variants.PREFETCH: the
shipped default since 2026-12-05). Per case and rule:
the key's two capacities and the replay's time (``--replays`` replays back to back,
synchronized, after the capture), the rules' order alternating by round; ratios are each
rule's time over the classes' per round. Every rule's replay must give the same logits bit
for bit (the capacity changes no arithmetic): checked every round. Then the decode graphs
(batch 64 to 256) and the lone-prefill graphs (96 to 1,000 tokens) with and without the
spread rule, timed and checked the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import numpy as np
from common import SMOLLM2, stat, write_json
from mixed_step import make_batch

from crucible.engine.runner import ModelRunner
from crucible.kernels import variants
from crucible.engine.settings import Settings
from crucible.model.tiny import tiny_random_model

# (name, decode rows, their history range, prefill chunk lengths, the chunks' start range)
CASES = (
    ("cohort late: 48 decode at 1,300-2,600 + 16x~60 at ~1,300", 48, (1300, 2600),
     (60,) * 15 + (75,), (1250, 1350)),
    ("joiner late: 63 decode at 1,300-2,600 + 84 at ~1,400", 63, (1300, 2600), (84,),
     (1350, 1450)),
    ("cohort: 48 decode at 850-1,000 + 16x~60 at ~960", 48, (850, 1000), (60,) * 15 + (75,),
     (940, 980)),
    ("serve 256: 244 decode at 300-2,600 + 4x~70 at ~1,100", 244, (300, 2600), (70,) * 4,
     (1000, 1200)),
)


def replay_ms(runner: ModelRunner, batch: Any, replays: int) -> tuple[float, Any, tuple]:
    """Capture the step's mixed graph (its sightings first), then time back-to-back replays."""
    mg = runner.backend.mixed_graphs
    ms, logits = timed_replays(lambda: runner.forward_device(batch), replays,
                               lambda: mg.num_replays)
    return ms, logits, mg.key(batch)


# Steps of the other graph kinds, keyed today by graph_capacity (decode: 2,048, then every
# 1,024) or the exact capacity (a lone prefill): (name, decode rows, history range, prompt
# length). Batch 64 is #15's decode figure (128-token prompts).
GRAPH_CASES = (("decode 64 at 128-192", 64, (128, 192), 0),
               ("decode 128 at 300-1,200", 128, (300, 1200), 0),
               ("decode 256 at 300-2,600", 256, (300, 2600), 0),
               ("prefill 96", 0, (0, 0), 96),
               ("prefill 320", 0, (0, 0), 320),
               ("prefill 1,000", 0, (0, 0), 1000))


def graph_ab(runner: ModelRunner, rounds: int, replays: int) -> dict[str, Any]:
    """Decode and lone-prefill graphs without the spread rule (their capacities as before
    the classes) and with it ("classes" below), timed and checked as above."""
    from crucible.backend import cupy_graphs
    from crucible.kernels.variants import score_capacity

    be = runner.backend
    g, pg = be.graphs, be.prefill_graphs
    owned = pg.classes
    spread = dataclasses.replace(owned.get(), spread=True)
    g.classes.classes = owned.classes = spread  # kept while the geometry and variant hold
    rng = np.random.default_rng(1)
    out: dict[str, Any] = {}
    for name, rows, hist, n in GRAPH_CASES:
        batch = make_batch(rng, rows, hist, (n,) if n else (), runner.config.vocab_size,
                           pages=176)
        exact = score_capacity(batch.max_end)
        if rows:
            bucket = next(b for b in cupy_graphs.BUCKETS if b >= rows)
            caps = {"before": cupy_graphs.graph_capacity(exact, g.ceiling),
                    "classes": g.capacity_class(exact, bucket)}
        else:
            caps = {"before": exact, "classes": owned.get().slices(exact, n, 1)}
        got, times = {}, {k: [] for k in caps}
        for r in range(rounds):
            for rule in list(caps) if r % 2 == 0 else list(caps)[::-1]:
                c = caps[rule]
                if rows:  # the bucket replays at c: a pair of that key
                    g.capacity_class = lambda _c, _b, v=c: v  # noqa: E731
                    step, count = (lambda: runner.forward_device(batch)), (lambda: g.num_replays)
                else:  # the prefill graphs widen an exact capacity themselves
                    pg.classes = owned if rule == "classes" else None
                    step = lambda: pg.run(batch, exact, runner._forward_meta)  # noqa: E731
                    count = lambda: pg.num_replays  # noqa: E731
                try:
                    ms, logits = timed_replays(step, replays, count)
                finally:
                    g.__dict__.pop("capacity_class", None)
                    pg.classes = owned
                got[rule] = logits.view(np.uint32).tobytes()
                times[rule].append(ms)
            if len(set(got.values())) != 1:
                raise SystemExit(f"{name}: the capacities' logits differ")
        out[name] = {"capacities": caps, **{f"{k}_ms": stat(v) for k, v in times.items()},
                     "before_over_classes": stat(
                         [a / b for a, b in zip(times["before"], times["classes"])])}
        print(f"{name}: {caps} x{out[name]['before_over_classes']['median']:.3f}",
              file=sys.stderr)
    g.classes.classes = owned.classes = None  # the shipped rule again, remade on use
    return out


def chat_steps(cases: tuple) -> tuple[ModelRunner, dict[str, Any]]:
    """A runner of random weights in the default model's shapes, mixed graphs to 1,024 rows
    and a pool for 256 rows of 176 pages, and each case's step (mixed_step.make_batch)."""
    model = tiny_random_model(seed=1, weights="int8", **SMOLLM2)
    runner = ModelRunner(model, num_pages=176 * 256, device="cuda",
                         settings=Settings(device="cuda", mixed_graph_rows=1024))
    rng = np.random.default_rng(0)
    return runner, {name: make_batch(rng, d, h, c, runner.config.vocab_size, s, pages=176)
                    for name, d, h, c, s in cases}


def timed_replays(step: Any, replays: int, count: Any) -> tuple[float, Any]:
    import cupy as cp

    before = count()
    for _ in range(3):  # a mixed or prefill key is captured on its second sighting
        step()
    assert count() > before, "the step did not replay a graph"
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(replays):
        out = step()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t) * 1e3 / replays, cp.asnumpy(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", default="bench/capacity-classes.json")
    args = p.parse_args(argv)
    runner, batches = chat_steps(CASES)
    mg = runner.backend.mixed_graphs
    owned = mg.classes
    prefetch_default = variants.PREFETCH
    plain = dataclasses.replace(owned.get(), prefetch=False)
    rules = {"classes": plain, "spread": dataclasses.replace(plain, spread=True),
             "powers": None, "prefetch": dataclasses.replace(plain, prefetch=True)}
    res: dict[str, dict[str, list[float]]] = {}
    keys: dict[str, dict[str, list[int]]] = {}
    for r in range(args.rounds):
        for name, batch in batches.items():
            got = {}
            for rule in list(rules) if r % 2 == 0 else list(rules)[::-1]:
                mg.clear()  # every key captured afresh under this rule
                mg.classes = owned if rules[rule] else None
                owned.classes = rules[rule] or plain
                variants.PREFETCH = rule == "prefetch"  # read when the graph is captured
                ms, logits, key = replay_ms(runner, batch, args.replays)
                got[rule] = logits.view(np.uint32).tobytes()
                res.setdefault(name, {}).setdefault(rule + "_ms", []).append(ms)
                keys.setdefault(name, {})[rule] = [int(key[4]), int(key[5])]
            if len(set(got.values())) != 1:
                raise SystemExit(f"{name}: the rules' logits differ")
            d = res[name]
            for rule in ("spread", "powers", "prefetch"):
                d.setdefault(f"{rule}_over_classes", []).append(
                    d[f"{rule}_ms"][-1] / d["classes_ms"][-1])
        print(f"round {r} done", file=sys.stderr, flush=True)
    mg.classes, owned.classes, variants.PREFETCH = owned, plain, False  # graph_ab: plain
    others = graph_ab(runner, args.rounds, args.replays)
    variants.PREFETCH, owned.classes = prefetch_default, None  # the shipped rule, remade
    summary = {n: {"capacities (decode, slices)": keys[n],
                   **{k: stat(v) for k, v in d.items()}} for n, d in res.items()}
    for n, d in summary.items():
        print(f"{n}: {keys[n]} classes {d['classes_ms']['median']:.2f} ms; over it: "
              + ", ".join(f"{r} x{d[r + '_over_classes']['median']:.3f}"
                          for r in ("spread", "powers", "prefetch")), file=sys.stderr)
    write_json(args.json, {"command": "python3 bench/capacity_classes.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                           "logits_identical": True, "results": summary,
                           "decode_and_prefill_graphs": others})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
