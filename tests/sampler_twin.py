"""A numpy twin of the device sampler, for tests: same interface as CupySampler.

It packs the rows with ``pack_rows`` and samples from what it reads back with
``unpack_rows``, rebuilding a request whose ``sample_row`` call sees exactly the packed
penalties, masks and draw counter. So an engine run through the twin exercises the engine's
device-sampling path and proves that the one-buffer metadata carries everything the host
sampler uses: any field lost in packing changes the tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from crucible.step.row_buffer import pack_rows, unpack_rows
from crucible.step.rows import MASK, PEN, REP, ReadySample, RowSampling, SampleOutput
from crucible.engine.rng import random_bits, uniform
from crucible.engine.sampling import SamplingParams, sample_row


def rebuild(d: dict[str, Any]) -> tuple[SamplingParams, list[int], list[int], list[int]]:
    """(params, prompt, output, stop ids) that make ``sample_row`` do what row ``d`` says."""
    ids, counts, flags = d["entry_ids"], d["entry_counts"], d["entry_flags"]
    rep = [int(t) for t, f in zip(ids, flags) if f & REP]
    pen = [(int(t), int(c)) for t, c, f in zip(ids, counts, flags) if f & PEN]
    masked = [int(t) for t, f in zip(ids, flags) if f & MASK]
    n = d["counter"]
    if pen:
        output = [t for t, c in pen for _ in range(c)]
        assert len(output) == n, "PEN counts must add up to the draw counter"
    else:  # only the length matters: fill with ids the repetition penalty already covers
        output = [rep[0] if rep else 0] * n
    params = SamplingParams(
        max_tokens=n + 1, min_tokens=n + 1 if masked else 0, temperature=d["temperature"],
        top_k=d["top_k"] or None, top_p=d["top_p"], min_p=d["min_p"],
        repetition_penalty=d["repetition_penalty"], presence_penalty=d["presence_penalty"],
        frequency_penalty=d["frequency_penalty"], logprobs=d["num_logprobs"])
    return params, rep, output, masked


class NumpyTwinSampler:
    name = "numpy-twin"

    def __init__(self) -> None:
        self.num_rows = 0  # rows sampled (tests assert the device path really ran)

    def sample(self, logits: Any, rows: Sequence[RowSampling]) -> SampleOutput:
        logits = np.asarray(logits)
        buf = pack_rows(rows, logits.shape[0], logits.shape[1])
        ids, lps = [], []
        for d in unpack_rows(buf, len(rows)):
            params, prompt, output, stop = rebuild(d)
            res = sample_row(logits[d["logits_row"]], params, prompt=prompt, output=output,
                             seed=d["seed"], stop_ids=stop)
            ids.append(res.token_id)
            lps.append(res.logprobs)
        self.num_rows += len(rows)
        return SampleOutput(tuple(ids), tuple(lps))

    def sample_async(self, logits: Any, rows: Sequence[RowSampling], tokens_out: Any = None,
                     ready: bool = False) -> ReadySample:
        """Samples at once: the host has the result before the call returns."""
        return ReadySample(self.sample(logits, rows))

    def rows_to_host(self, logits: Any, rows: Sequence[int]) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)[list(rows)]

    # The check harness's device hooks (crucible/checks/sampling_check.py).
    def to_device(self, x: np.ndarray) -> np.ndarray:
        return x

    def draws(self, seeds: Sequence[int], counters: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([random_bits(s, n) for s, n in zip(seeds, counters)], np.uint64),
                np.array([uniform(s, n) for s, n in zip(seeds, counters)], np.float64))



def one_rank_late(logits_row: np.ndarray, temperature: float, token: int,
                  from_rank: int = 0) -> int:
    """The candidate right after ``token`` in the host's order (y = x / T descending, ids
    ascending on ties) when ``token`` ranks ``from_rank`` or later, else ``token``: a draw
    placed one rank late (the negative controls of the sampler's narrowing)."""
    order = np.argsort(-(np.asarray(logits_row, np.float64) / temperature), kind="stable")
    rank = int(np.nonzero(order == token)[0][0])
    return int(order[min(rank + 1, order.size - 1)]) if rank >= from_rank else token
