"""What a step sends to the sampler and what comes back, per scheduled slice.

A slice's draw is the device sampler's (token id, logprobs), a host draw still to run (the
host sampler runs at the update, so ``--profile`` can time it), or None when the slice does
not sample. Logits rows of a slice: its prompt-logprob rows, then its sampled row.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from crucible.step.rows import RowSampling, row_sampling
from crucible.step.batch import PackedBatch
from crucible.engine.request import Request
from crucible.engine.sampling import SampleResult, sample_row
from crucible.engine.scheduler import ScheduledSlice

Logprobs = dict[int, float]
Draw = tuple[int, Logprobs | None] | Callable[[], SampleResult] | None
Update = tuple[ScheduledSlice, np.ndarray | None, Draw]  # (slice, prompt-logprob logits, draw)


def host_updates(runner: Any, slices: Sequence[ScheduledSlice], batch: PackedBatch,
                 vocab_size: int, batch_greedy: bool = True) -> list[Update]:
    """Forward on the runner, then one host draw per sampling slice (run at its update).
    ``batch_greedy``: rows whose draw is a plain argmax (``plain_greedy``) take it from one
    argmax over all of them, now (the same ids: the first maximum of each row)."""
    logits = runner.forward(batch)
    if logits.shape != (batch.final_rows.shape[0], vocab_size):
        raise RuntimeError(f"runner returned logits of shape {logits.shape}, expected "
                           f"{(batch.final_rows.shape[0], vocab_size)}")
    updates: list[Update] = []
    greedy_at: list[int] = []  # indices into updates
    greedy_rows: list[int] = []  # their logits rows
    row = 0
    for sl in slices:
        n = len(sl.prompt_rows)
        draw = None
        if sl.sample:
            req = sl.request
            start = req.argmax_from  # plain_greedy, decided once per request
            if batch_greedy and start is not None \
                    and len(req.token_ids) - req.num_prompt_tokens >= start:
                greedy_at.append(len(updates))
                greedy_rows.append(row + n)
            else:
                last = logits[row + n]
                draw = lambda last=last, req=req: sample_host(last, req)  # noqa: E731
        updates.append((sl, logits[row : row + n] if n else None, draw))
        row += n + sl.sample  # its logits rows: the prompt rows, then the sampled row
    if greedy_rows:
        ids = np.argmax(logits[greedy_rows], axis=1).tolist()
        for i, token in zip(greedy_at, ids):
            sl, prompt_logits, _ = updates[i]
            updates[i] = (sl, prompt_logits, (token, None))
    return updates

def sampling_rows(slices: Sequence[ScheduledSlice], vocab_size: int, row0: int = 0
                  ) -> tuple[list[RowSampling], list[int]]:
    """The device sampler's rows of a step, and the rows whose logits come to the host;
    ``row0``: the logits row of the first slice (the pipeline packs rows before them)."""
    # Every request appears once per step, so its state here is the state at its update.
    rows: list[RowSampling] = []
    host_rows: list[int] = []
    row = row0
    for sl in slices:
        n = len(sl.prompt_rows)
        if n:
            host_rows += range(row, row + n)
        if sl.sample:
            req = sl.request
            meta = req.plain_row(row + n, len(req.token_ids) - req.num_prompt_tokens)
            if meta is None:  # penalties or min_tokens masking: they read the history
                prompt, output = req.sampler_history()
                meta = row_sampling(row + n, req.params, prompt=prompt, output=output,
                                    seed=req.seed, stop_ids=req.stop_ids,
                                    vocab_size=vocab_size)
            rows.append(meta)
        row += n + sl.sample  # its logits rows: the prompt rows, then the sampled row
    return rows, host_rows

def device_updates(cur: Any, vocab_size: int) -> list[Update]:
    """A launched step's results (waits for them), as (slice, prompt logits, draw) of its
    slices; a pipelined mixed step's decode rows (``cur.decode``) come first among the ids
    and are not in it (``StepUpdates._apply_rows`` takes them)."""
    out, host = cur.pending.result()
    n_host = sum(len(sl.prompt_rows) for sl in cur.slices)
    if len(out.token_ids) != cur.num_sampled or host.shape != (n_host, vocab_size):
        raise RuntimeError(f"device sampler returned {len(out.token_ids)} tokens and "
                           f"{host.shape} host rows, expected {cur.num_sampled} and "
                           f"{(n_host, vocab_size)}")
    # The device already drew: its (token id, logprobs) go straight to _update.
    updates: list[Update] = []
    hrow = 0
    k = 0 if cur.decode is None else len(cur.decode.requests)
    for sl in cur.slices:
        n = len(sl.prompt_rows)
        draw = None
        if sl.sample:
            draw = (out.token_ids[k], out.logprobs[k])
            k += 1
        updates.append((sl, host[hrow : hrow + n] if n else None, draw))
        hrow += n
    return updates


def sample_host(logits: np.ndarray, req: Request) -> SampleResult:
    prompt, output = req.sampler_history()
    return sample_row(logits, req.params, prompt=prompt, output=output, seed=req.seed,
                      stop_ids=req.stop_ids)
