"""Cases for ``gpu-sampling``: logits, request histories, the host oracle and its margins.

A ``Case`` is one sampling row as the engine would build it (params, prompt, output, seed,
stop ids) pointing at one row of a logits matrix; ``Case.host`` is the oracle
(``sample_row``) and ``Case.sampling`` the device sampler's input. ``boundary_margin`` says
how close the host's own decisions came to a rounding boundary, so that a mismatch there
(allowed by the contract, ~1e-13 per draw) is told apart from a bug.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from crucible.step.rows import RowSampling, row_sampling
from crucible.engine.rng import uniform
from crucible.engine.sampling import SampleResult, SamplingParams, sample_row, top_candidates

KINDS = ("random", "peaked", "tied", "tiedtop")
TEMPERATURES = (0.3, 0.8, 1.0, 1.7)
TOP_K = (None, 1, 5, 40, 128, 500)
TOP_P = (0.5, 0.9, 1.0)
MIN_P = (0.0, 0.05)
LOGPROBS = (None, 0, 1, 5, 20)


def make_logits(kind: str, rows: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """f32 [rows, vocab]. random: N(0, 2^2); peaked: a few tokens far ahead (like a chat
    model's next token); tied: a coarse grid, so hundreds of exact ties everywhere, the
    maximum included; tiedtop: random with ten exact maxima; chatlike: for timings."""
    out = np.empty((rows, vocab), np.float32)
    for r in range(rows):
        if kind == "random":
            x = rng.standard_normal(vocab) * 2.0
        elif kind == "peaked":
            x = rng.standard_normal(vocab) * 1.5
            x[rng.choice(vocab, 4, replace=False)] += (11.0, 9.5, 9.0, 7.0)
        elif kind == "tied":
            x = rng.integers(-12, 4, vocab) * 0.5
        elif kind == "tiedtop":
            x = rng.standard_normal(vocab)
            x[rng.choice(vocab, 10, replace=False)] = x.max() + 1.0
        elif kind == "chatlike":  # a chat model's usual step: >99% of the mass on a few ids
            x = rng.standard_normal(vocab) * 1.2
            x[rng.choice(vocab, 4, replace=False)] += (17.0, 15.0, 14.0, 12.0)
        else:
            raise ValueError(f"unknown logits kind {kind!r}")
        out[r] = x
    return out


@dataclass(frozen=True)
class Case:
    label: str
    row: int
    params: SamplingParams
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    seed: int
    stop_ids: tuple[int, ...]

    def sampling(self, vocab: int, row: int | None = None) -> RowSampling:
        return row_sampling(self.row if row is None else row, self.params, prompt=self.prompt,
                            output=self.output, seed=self.seed, stop_ids=self.stop_ids,
                            vocab_size=vocab)

    def host(self, logits: np.ndarray) -> SampleResult:
        return sample_row(logits[self.row], self.params, prompt=list(self.prompt),
                          output=list(self.output), seed=self.seed, stop_ids=self.stop_ids)


def history(logits_row: np.ndarray, penalties: bool, mask: bool,
            rng: np.random.Generator) -> dict:
    """Prompt/output/stop ids that make penalties and masking hit the row's best tokens."""
    vocab = logits_row.shape[0]
    best = np.argsort(-logits_row, kind="stable")[:6].tolist()
    prompt = rng.integers(0, vocab, 40).tolist() + best[:3]
    output = rng.integers(0, vocab, 9).tolist() + [best[0], best[0], best[1]]
    seed = int(rng.integers(0, 2**63)) * (-1 if rng.random() < 0.2 else 1)
    pen = dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.25)
    return dict(prompt=tuple(prompt), output=tuple(output), seed=seed,
                stop_ids=(best[2], best[0], vocab + 5),
                kw=dict(pen if penalties else {}, min_tokens=len(output) + 2 if mask else 0))


def case(label: str, row: int, logits: np.ndarray, rng: np.random.Generator, *,
         penalties: bool = False, mask: bool = False, **params: object) -> Case:
    h = history(logits[row], penalties, mask, rng)
    kw = dict(h["kw"], max_tokens=len(h["output"]) + 4, **params)
    return Case(label, row, SamplingParams(**kw), h["prompt"], h["output"], h["seed"],
                h["stop_ids"])


def matrix_cases(kind: str, logits: np.ndarray, rng: np.random.Generator,
                 quick: bool = False) -> list[Case]:
    """The brief's matrix: temperature x top_k x top_p x min_p x penalties x masking."""
    combos = list(itertools.product(TEMPERATURES, TOP_K, TOP_P, MIN_P, (False, True),
                                    (False, True)))
    if quick:
        combos = combos[::29]
    out = []
    for i, (t, k, p, m, pen, mask) in enumerate(combos):
        label = f"{kind} T={t} top_k={k} top_p={p} min_p={m} pen={int(pen)} mask={int(mask)}"
        out.append(case(label, i % logits.shape[0], logits, rng, penalties=pen, mask=mask,
                        temperature=t, top_k=k, top_p=p, min_p=m,
                        logprobs=LOGPROBS[i % len(LOGPROBS)]))
    return out


def _host_weights(logits_row: np.ndarray, c: Case) -> tuple[np.ndarray, int, list[float]]:
    """The host's kept weights (in candidate order), keep, and its decisions' margins."""
    p = c.params
    x = np.asarray(logits_row, np.float64).copy()
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(c.prompt + c.output, np.int64))
        v = x[seen]
        x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if c.output and (p.presence_penalty or p.frequency_penalty):
        ids, counts = np.unique(np.asarray(c.output, np.int64), return_counts=True)
        x[ids] -= p.presence_penalty + p.frequency_penalty * counts.astype(np.float64)
    if len(c.output) < p.min_tokens:
        masked = [t for t in c.stop_ids if 0 <= t < x.shape[0]]
        x[np.asarray(masked, np.int64)] = -np.inf
    x = x / p.temperature
    xs = x[top_candidates(x, p.top_k or x.shape[0])]
    w = np.exp(xs - xs[0])
    keep, margins = w.shape[0], []
    if p.top_p < 1.0:
        cum = np.cumsum(w / w.sum())
        j = int(np.searchsorted(cum, p.top_p, side="left"))
        margins += [abs(cum[i] - p.top_p) for i in (j - 1, j) if 0 <= i < cum.shape[0]]
        keep = min(keep, j + 1)
    if p.min_p > 0.0:
        margins.append(float(np.min(np.abs(w[:keep] - p.min_p))) / p.min_p)
        keep = min(keep, max(1, int(np.count_nonzero(w[:keep] >= p.min_p))))
    return w[:keep], keep, margins


def boundary_margin(logits_row: np.ndarray, c: Case) -> tuple[float, bool]:
    """(smallest relative distance of a host decision to its threshold, whether every kept
    weight is exact). Greedy decisions are exact comparisons: margin inf."""
    if c.params.greedy:
        return math.inf, True
    w, keep, margins = _host_weights(logits_row, c)
    cum = np.cumsum(w)
    theta = uniform(c.seed, len(c.output)) * cum[-1]
    margins.append(float(np.min(np.abs(cum - theta))) / cum[-1])
    exact = bool(np.all((w == 1.0) | (w == 0.0)))
    return min(margins), exact


def chi_square_p(stat: float, dof: int) -> float:
    """P(chi2_dof >= stat): the regularized upper incomplete gamma Q(dof/2, stat/2)."""
    a, x = dof / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    log_pre = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # P(a, x) by its power series, Q = 1 - P
        term = total = 1.0 / a
        n = a
        while term > total * 1e-16:
            n += 1.0
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_pre))
    # Q(a, x) by its continued fraction, evaluated with the modified Lentz method.
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h * math.exp(log_pre)
