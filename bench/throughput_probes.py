"""The throughput bench's exactness probes (bench/throughput.py): which requests, their
params, and the bitwise comparison of a probe's run alone with its run inside the workload.


Exactness probes (``--probes K``, default 4; 0: off): K requests of the workload, spread
over its prompt lengths (the K quantiles of the length-sorted order, distinct lengths where
the mix has them), get their own params: ``logprobs=5``, a fixed ``seed`` (so the draw does
not hang on arrival order) and, alternately, seeded sampling (``--temperature``, or 1.0 when
that is 0) and greedy; the rest of the workload keeps its params. After the warm-up each
probe runs ALONE on the same LLM (``llm.generate([prompt], [params])``, untimed, reported
apart as ``probes_alone``); every timed round then carries the probes inside the workload,
and each probe's token ids and logprobs are compared with its alone run bitwise (per token:
the id, the logprob dict's keys in order, the values as f64 bit patterns). The JSON's
``probes`` lists index, prompt/output tokens, temperature, seed, ``identical`` and
``first_diff`` (round, token position, what differed, both sides); the table prints
``probes identical: k/K``, and the script exits 1 (after writing the JSON) when any probe
differs. The probes are K of the N requests, so their logprobs (a log-softmax and a top-5
per token, and no argmax fast path for the greedy ones) barely move the throughput figure.
``--probe-negative-control`` (manual use) gives the first sampled probe's alone run a
different seed, so the check must report a difference and exit 1: it shows the check can
fail.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from crucible import SamplingParams

PROBE_LOGPROBS = 5
PROBE_SEED_BASE = 7_000_003  # probe i's seed: PROBE_SEED_BASE + workload index


def pick_probes(sizes: list[tuple[int, int]], k: int) -> list[int]:
    """K workload indices spread over the prompt lengths: the K quantile midpoints of the
    length-sorted order, moved to the nearest unused distinct length where there is one."""
    k = min(k, len(sizes))
    if k <= 0:
        return []
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i][0], i))
    picked: list[int] = []
    lens: set[int] = set()
    for j in range(k):
        pos = min(len(order) - 1, int((j + 0.5) * len(order) / k))
        cands = sorted(range(len(order)), key=lambda q: abs(q - pos))
        choice = next((order[q] for q in cands if order[q] not in picked
                       and sizes[order[q]][0] not in lens), None)
        if choice is None:
            choice = next(order[q] for q in cands if order[q] not in picked)
        picked.append(choice)
        lens.add(sizes[choice][0])
    return picked


def probe_params(j: int, index: int, max_tokens: int, temperature: float) -> SamplingParams:
    """Even j: seeded sampling; odd j: greedy. Both ask for logprobs, with a fixed seed."""
    temp = (temperature if temperature > 0 else 1.0) if j % 2 == 0 else 0.0
    return SamplingParams(max_tokens=max_tokens, temperature=temp, ignore_eos=True,
                          seed=PROBE_SEED_BASE + index, logprobs=PROBE_LOGPROBS)


def plan_probes(sizes: list[tuple[int, int]], params: list[SamplingParams], k: int,
                temperature: float, negative_control: bool
                ) -> tuple[list[int], list[SamplingParams], int | None]:
    """Pick K probes and give them their params in ``params`` (in place). Returns the probe
    indices, the params of their alone runs, and the probe whose alone run gets another seed
    (``--probe-negative-control``; else None)."""
    probe_idx = pick_probes(sizes, k)
    alone_params: list[SamplingParams] = []
    for j, i in enumerate(probe_idx):
        params[i] = probe_params(j, i, sizes[i][1], temperature)
        alone_params.append(params[i])
    control = None
    if negative_control and probe_idx:
        control = next((j for j, p in enumerate(alone_params) if not p.greedy), 0)
        pc = alone_params[control]
        alone_params[control] = dataclasses.replace(
            pc, seed=pc.seed + 1, temperature=pc.temperature if pc.temperature > 0 else 1.0)
    return probe_idx, alone_params, control


def f64_bits(v: float) -> str:
    return struct.pack("<d", v).hex()


def first_difference(alone: Any, inside: Any) -> dict[str, Any] | None:
    """The first token position where two outputs of one request differ (ids, logprob keys
    in order, logprob values as f64 bit patterns), or None when they are bitwise equal."""
    a_ids, b_ids = list(alone.token_ids), list(inside.token_ids)
    a_lp, b_lp = alone.logprobs, inside.logprobs
    if (a_lp is None) != (b_lp is None):
        return {"position": None, "what": "logprobs present on one side only"}
    n = max(len(a_ids), len(b_ids))
    for i in range(n):
        if i >= len(a_ids) or i >= len(b_ids):
            return {"position": i, "what": "length", "alone": len(a_ids),
                    "workload": len(b_ids)}
        if a_ids[i] != b_ids[i]:
            return {"position": i, "what": "token", "alone": a_ids[i], "workload": b_ids[i]}
        if a_lp is None:
            continue
        if i >= len(a_lp) or i >= len(b_lp):
            return {"position": i, "what": "logprobs length", "alone": len(a_lp),
                    "workload": len(b_lp)}
        da, db = a_lp[i], b_lp[i]
        if list(da) != list(db):
            return {"position": i, "what": "logprob keys", "alone": list(da),
                    "workload": list(db)}
        for t in da:
            if f64_bits(da[t]) != f64_bits(db[t]):
                return {"position": i, "what": "logprob value", "token": t,
                        "alone": repr(da[t]), "workload": repr(db[t]),
                        "alone_bits": f64_bits(da[t]), "workload_bits": f64_bits(db[t])}
    if a_lp is not None and len(a_lp) != len(b_lp):
        return {"position": n, "what": "logprobs length", "alone": len(a_lp),
                "workload": len(b_lp)}
    return None

