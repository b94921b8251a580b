"""gpu-graph-check's mixed steps past 512 rows (CRUCIBLE_MIXED_GRAPH_ROWS above 512): a
step of hundreds of running decodes beside a few whole prompts, the shape serving makes,
replayed from a mixed graph == the same step run eagerly, bitwise."""

from __future__ import annotations

import numpy as np

from crucible.checks.batch_check import Counts, Req, pages_for, run_step
from crucible.engine.runner import ModelRunner


def check_mixed_large(cand: ModelRunner, ref: ModelRunner, steps: int, seed: int,
                      rows: int = 512) -> tuple[int, int]:
    """Mixed steps past 512 rows: max_tokens - 128 running decodes beside 1..MAX_SLICES
    joiners' whole prompts, filling the step to at most max_tokens rows (the candidate's
    mixed graphs' ``max_tokens``, CRUCIBLE_MIXED_GRAPH_ROWS; ``rows`` where it has none),
    on the candidate (padded replays) == eager, every row bitwise; on the GPU each must be
    a replay. Nothing to check up to 512 rows (check_mixed covers those)."""
    from crucible.backend.cupy_mixed_graphs import MAX_SLICES

    mixed = getattr(cand.backend, "mixed_graphs", None)
    max_tokens = rows if mixed is None else mixed.max_tokens
    if max_tokens <= 512:
        return 0, 0
    rng = np.random.default_rng(seed + 11)
    vocab = cand.config.vocab_size
    if mixed is not None:
        mixed.capture_after, mixed.max_graphs = 1, 10**6
    c = Counts()
    free = rng.permutation(cand.num_pages).tolist()
    n_dec = max_tokens - 128
    dec: list[tuple[Req, Req]] = []
    for i in range(n_dec):  # short prompts: one page holds each request to its end
        toks = rng.integers(0, vocab, int(rng.integers(1, 9))).tolist()
        pages = [free.pop() for _ in range(pages_for(len(toks) + steps + 1))]
        dec.append((Req(f"L{i}", list(toks), pages), Req(f"L{i}", list(toks), pages)))
    run_step(cand, [a for a, _ in dec])  # their prefill: many slices, eager on both
    run_step(ref, [b for _, b in dec])
    replays = 0
    for s in range(steps):
        k = int(rng.integers(1, MAX_SLICES + 1))
        room = max_tokens - n_dec
        joiners: list[tuple[Req, Req]] = []
        for j in range(k):
            n = int(rng.integers(2, max(3, room // k)))
            toks = rng.integers(0, vocab, n).tolist()
            pages = [free.pop() for _ in range(pages_for(n + 1))]
            joiners.append((Req(f"J{s}.{j}", list(toks), pages),
                            Req(f"J{s}.{j}", list(toks), pages)))
        order = [(dec + joiners)[i] for i in rng.permutation(len(dec) + len(joiners))]
        before = mixed.num_replays if mixed is not None else 0
        run_step(cand, [a for a, _ in order])
        run_step(ref, [b for _, b in order])
        if mixed is not None:
            replays += mixed.num_replays - before
            c.check(mixed.num_replays == before + 1, f"large mixed step {s}: not replayed")
        for a, b in order:
            c.compare(f"large mixed step {s}: {a.rid} at {a.done}", a.logits[-1], b.logits[-1])
        for a, _ in joiners:  # done: their pages go back
            free.extend(a.pages)
    if mixed is not None:
        print(f"large mixed steps ({n_dec} decodes + slices, up to {max_tokens} rows): "
              f"{replays} replays of {steps}")
    return c.result()
