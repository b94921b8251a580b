"""gpu-graph-check's mixed steps with long histories: decode rows 1,100-3,000 positions into
their requests beside short prompt slices (and a slice continuing a long prompt), replayed
from a mixed graph == the same step run eagerly, bitwise.

Why a check of its own: a mixed graph sizes its two attention launches by two score
capacities (backend/cupy_mixed_graphs.py: the decode rows' longest history, and the
slices' own, at least SLICE_CAPACITY_FLOOR). They differ only past 1,024 positions, which
the other mixed checks never reach (their tiny model's context is 512). So this one runs a
tiny model with a 4,096-position context (or the model under check) and fails unless some
replayed step had a slice capacity below its decode capacity."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from crucible.checks.batch_check import Counts, Req, check_model, pages_for, run_step
from crucible.engine.runner import ModelRunner
from crucible.engine.settings import Settings

# (model, device, pages, settings) -> (candidate, eager reference): graph_check.make_pair
MakePair = Callable[[Any, str, int, Settings], tuple[ModelRunner, ModelRunner]]

LONG_PROMPTS = (1100, 1500, 2047, 2049, 3000)  # decode histories past the slice floor
LONG_CONTEXT = 4096


def long_model(model: Any) -> Any:
    """The model under check when its context reaches LONG_CONTEXT, else the checks' tiny
    model with a 4,096-position context."""
    if model.config.max_context >= LONG_CONTEXT:
        return model
    return check_model(model.weights_mode, LONG_CONTEXT)


def check_mixed_long(model: Any, device: str, settings: Settings, steps: int, seed: int,
                     make_pair: MakePair) -> tuple[int, int]:
    """``steps`` mixed steps: the long decodes plus 1..4 short joiners'
    prompts, every other step also the last 100 tokens of a 1,300-token prompt (its first
    1,200 in a step of their own before). On the GPU each step must replay, and at least
    one with its slices' capacity below its decode rows' (the split under test)."""
    from crucible.backend.cupy_mixed_graphs import MAX_SLICES

    model = long_model(model)
    rng = np.random.default_rng(seed + 13)
    vocab = model.config.vocab_size
    # Joiners of up to 100 rows beside the five decodes and the long chunk: at most four
    # keep a step within the default 512 graph rows (check_mixed_large goes past them).
    most = min(MAX_SLICES - 1, 4)
    per_step = (most + 1) * pages_for(1300)
    n_pages = sum(pages_for(n + steps + 1) for n in LONG_PROMPTS) + steps * per_step + 16
    cand, ref = make_pair(model, device, n_pages, settings)
    mixed = getattr(cand.backend, "mixed_graphs", None)
    if mixed is not None:
        mixed.capture_after, mixed.max_graphs = 1, 10**6
    c = Counts()
    free = rng.permutation(n_pages).tolist()
    take = lambda n: [free.pop() for _ in range(pages_for(n))]  # noqa: E731

    def pair(rid: str, n: int, room: int) -> tuple[Req, Req]:
        toks, pages = rng.integers(0, vocab, n).tolist(), take(n + room)
        return Req(rid, list(toks), pages), Req(rid, list(toks), pages)

    dec = [pair(f"D{i}", n, steps + 1) for i, n in enumerate(LONG_PROMPTS)]
    for a, b in dec:  # each prompt alone (a singleton prefill), its first token out
        run_step(cand, [a])
        run_step(ref, [b])
    replays = split = 0
    for s in range(steps):
        joiners = [pair(f"J{s}.{j}", int(rng.integers(2, 120)), 1)
                   for j in range(int(rng.integers(1, most + 1)))]
        if s % 2:  # a long prompt's second chunk: a slice ending past the floor
            a, b = pair(f"C{s}", 1300, 1)
            run_step(cand, [a], chunk=1200)
            run_step(ref, [b], chunk=1200)
            joiners.append((a, b))
        order = [(dec + joiners)[i] for i in rng.permutation(len(dec) + len(joiners))]
        before = mixed.num_replays if mixed is not None else 0
        keys_before = set(mixed.graphs) if mixed is not None else set()
        run_step(cand, [a for a, _ in order], chunk=100)
        run_step(ref, [b for _, b in order], chunk=100)
        if mixed is not None:
            replays += mixed.num_replays - before
            c.check(mixed.num_replays == before + 1, f"long mixed step {s}: not replayed")
            split += sum(k[5] < k[4] for k in set(mixed.graphs) - keys_before)
        for a, b in order:
            c.compare(f"long mixed step {s}: {a.rid} at {a.done}", a.logits[-1], b.logits[-1])
        for a, _ in joiners:
            free.extend(a.pages)
    if mixed is not None:
        print(f"long mixed steps (decode histories {LONG_PROMPTS[0]}-{LONG_PROMPTS[-1]} + "
              f"slices): {replays} replays of {steps}, {split} graphs with the slices' "
              f"capacity below the decode rows'")
        c.check(split > 0, "no long mixed step split its two capacities")
    return c.result()
