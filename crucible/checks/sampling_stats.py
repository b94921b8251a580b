"""``gpu-sampling``'s statistical, engine and timing sections (see sampling_check.py).

chi2     the device's draws over many seeds against a known small distribution (Pearson's
         statistic and its p-value), plus a negative control: the same rows with other seeds
         must draw differently;
engine   one tiny model's engine, sampling on the device vs on the host: identical tokens,
         finish reasons and prompt logprobs, sampled logprobs within 1e-9;
timing   microseconds per sampling call (upload, kernel, ids back) for 1 and 64 rows.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from crucible.step.row_buffer import pack_rows
from crucible.step.rows import MASK64, row_sampling
from crucible.engine.sampling import SamplingParams, sample_row
from crucible.checks.batch_check import Counts
from crucible.checks.sampling_cases import case, chi_square_p, make_logits

SMALL = np.array([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0]], np.float32)


def expected_probs(logits: np.ndarray, temperature: float, top_k: int | None) -> np.ndarray:
    x = logits.astype(np.float64) / temperature
    keep = np.argsort(-x, kind="stable")[: top_k or x.shape[0]]
    p = np.zeros_like(x)
    p[keep] = np.exp(x[keep] - x[keep].max())
    return p / p.sum()


def check_chi2(h: Any, c: Counts, rng: np.random.Generator, draws: int) -> None:
    dev = h.to_device(SMALL)
    for t, k in ((1.0, None), (0.7, 3)):
        base = row_sampling(0, SamplingParams(temperature=t, top_k=k), prompt=[0], output=[],
                            seed=0, stop_ids=(), vocab_size=SMALL.shape[1])
        seeds = [int(s) for s in rng.integers(0, 2**63, draws)]
        ns = [int(n) for n in rng.integers(0, 4096, draws)]
        rows = [dataclasses.replace(base, seed=s, counter=n) for s, n in zip(seeds, ns)]
        got = np.array(h.sampler.sample(dev, rows).token_ids)
        probs = expected_probs(SMALL[0], t, k)
        counts = np.bincount(got, minlength=SMALL.shape[1])
        live = probs > 0
        e = probs[live] * draws
        stat = float(((counts[live] - e) ** 2 / e).sum())
        dof = int(live.sum()) - 1
        p = chi_square_p(stat, dof)
        c.check(p >= 1e-4 and counts[~live].sum() == 0,
                f"chi2 T={t} top_k={k}: statistic {stat:.2f}, p = {p:.2e}, "
                f"{counts[~live].sum()} draws outside top_k")
        print(f"chi2 T={t} top_k={k}: {draws} draws, statistic {stat:.2f} ({dof} dof), "
              f"p-value {p:.3g}; counts {counts.tolist()}")
        other = [dataclasses.replace(r, seed=(r.seed + 1) & MASK64) for r in rows]
        diff = float(np.mean(np.array(h.sampler.sample(dev, other).token_ids) != got))
        c.check(diff > 0.3, f"negative control T={t}: other seeds changed only {diff:.1%}")
        print(f"negative control T={t} top_k={k}: seed + 1 changes {diff:.1%} of the draws "
              f"(independent draws: {1 - float((probs ** 2).sum()):.1%})")


ENGINE_REQUESTS = (
    dict(temperature=0.0, max_tokens=12, logprobs=3),
    dict(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2, max_tokens=10),
    dict(temperature=1.0, seed=5, prompt_logprobs=2, max_tokens=8),
    dict(temperature=1.2, min_p=0.05, stop_token_ids=(3, 4, 5, 6), min_tokens=4,
         max_tokens=12, presence_penalty=0.5, frequency_penalty=0.3),
    dict(temperature=0.6, top_p=0.5, logprobs=0, max_tokens=9),
)


def run_engine(runner: Any, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    from crucible.engine.engine import LLMEngine

    eng = LLMEngine(runner, getattr(runner.model, "tokenizer", None), seed=11)
    out: dict[str, dict] = {}
    for p, sp in zip(prompts, params):
        out[eng.add_request(p, sp)] = dict(ids=[], text="", lps=[], plp=None, reason=None)
    while eng.has_unfinished():
        for d in eng.step():
            o = out[d.request_id]
            o["ids"] += d.new_token_ids
            o["text"] += d.new_text
            o["lps"] += d.new_logprobs or ()
            o["plp"] = d.prompt_logprobs if d.prompt_logprobs is not None else o["plp"]
            o["reason"] = d.finish_reason
    out["stats"] = eng.stats()
    return out


def check_engine(c: Counts, make_runner: Callable[[bool], Any], rng: np.random.Generator) -> None:
    dev_runner = make_runner(True)
    vocab = dev_runner.config.vocab_size
    params = [SamplingParams(**kw) for kw in ENGINE_REQUESTS]
    params += [SamplingParams(temperature=float(rng.choice([0.0, 0.7, 1.0])), max_tokens=6,
                              top_k=int(rng.choice([5, 50])), seed=i) for i in range(11)]
    prompts = [rng.integers(0, vocab, int(rng.integers(1, 40))).tolist() for _ in params]
    dev = run_engine(dev_runner, prompts, params)
    host = run_engine(make_runner(False), prompts, params)
    c.check(dev.pop("stats") == host.pop("stats"), "engine: stats differ")
    for rid in host:
        a, b = dev[rid], host[rid]
        c.check(a["ids"] == b["ids"] and a["reason"] == b["reason"] and a["text"] == b["text"],
                f"engine {rid}: device {a['ids']} ({a['reason']}) vs host {b['ids']} "
                f"({b['reason']})")
        c.check(a["plp"] == b["plp"], f"engine {rid}: prompt logprobs differ")
        ok = len(a["lps"]) == len(b["lps"]) and all(
            list(x) == list(y) and max(abs(x[k] - y[k]) for k in y) <= 1e-9
            for x, y in zip(a["lps"], b["lps"]))
        c.check(ok, f"engine {rid}: sampled logprobs differ beyond 1e-9")
    print(f"engine: {len(host)} requests, device sampling == host sampling")


def time_sampler(h: Any, rng: np.random.Generator, vocab: int) -> None:
    import cupy as cp

    chat = make_logits("chatlike", 64, vocab, rng)
    flat = make_logits("random", 64, vocab, rng)
    configs = [("greedy", chat, dict(temperature=0.0)),
               ("greedy + penalties", chat, dict(temperature=0.0, penalties=True)),
               ("top_k=50 top_p=0.9", chat, dict(temperature=0.8, top_k=50, top_p=0.9)),
               ("top_p=0.9 (no top_k)", chat, dict(temperature=1.0, top_p=0.9)),
               ("T=1 defaults", chat, dict(temperature=1.0)),
               ("T=1 defaults + logprobs=5", chat, dict(temperature=1.0, logprobs=5)),
               ("T=1, flat logits", flat, dict(temperature=1.0)),
               ("T=0.7, flat logits", flat, dict(temperature=0.7)),
               ("top_p=0.9, flat logits", flat, dict(temperature=1.0, top_p=0.9))]
    print(f"timing (vocab {vocab}; chat-like logits unless flat; wall: one sample() call, i.e. "
          f"packing, upload, kernel, ids back; kernel: back-to-back launches; microseconds, "
          f"mean of 20 after 3 warm-ups):")
    for name, logits, kw in configs:
        dev = h.to_device(logits)
        for rows in (1, 64):
            cases = [case(name, r, logits, rng, **kw) for r in range(rows)]
            batch = [cs.sampling(vocab) for cs in cases]
            for _ in range(3):
                h.sampler.sample(dev, batch)
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                h.sampler.sample(dev, batch)
            wall_us = (time.perf_counter() - t0) / 20 * 1e6
            meta = cp.asarray(pack_rows(batch, logits.shape[0], vocab))
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(20):
                h.sampler.launch(dev, meta, rows)
            end.record()
            end.synchronize()
            gpu_us = cp.cuda.get_elapsed_time(start, end) / 20 * 1e3
            paths = h.sampler.last_paths()
            routes, narrowed = int(np.sum(paths & 1 > 0)), int(np.sum(paths & 32 > 0))
            t0 = time.perf_counter()
            host = cp.asnumpy(dev[:rows])
            for cs in cases:
                sample_row(host[cs.row], cs.params, prompt=list(cs.prompt),
                           output=list(cs.output), seed=cs.seed, stop_ids=cs.stop_ids)
            host_us = (time.perf_counter() - t0) * 1e6
            print(f"  {name:<26} rows {rows:>2}: wall {wall_us:8.1f}, kernel {gpu_us:8.1f} "
                  f"({routes} rows full-sorted, {narrowed} narrowed); host path {host_us:9.1f}")
