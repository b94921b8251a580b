"""Sampling parameters and the host sampler.

The sampler is deterministic by construction: logits are widened to f64, candidate order is
(logit descending, token id ascending) via a stable sort, and the one random number per
token comes from ``rng.uniform(seed, n)`` (counter-based). So a row's sampled token depends
only on its logits, the request's own token history, its params and (seed, n).

Pipeline for one row (the order is part of the contract):
  1. raw logits -> f64; ``logprobs`` are taken here, from the model's raw distribution
     (before penalties, temperature or truncation), as vLLM reports them by default;
  2. repetition penalty over prompt + output tokens (positive logits divided, others
     multiplied), then presence and frequency penalties over output tokens;
  3. while fewer than ``min_tokens`` were generated, stop ids (EOS unless ``ignore_eos``,
     plus ``stop_token_ids``) are masked to -inf;
  4. temperature 0 -> argmax (lowest id wins ties); otherwise divide by temperature, sort,
     keep top_k, then the smallest prefix reaching top_p, then tokens with
     prob >= min_p * max prob; draw by inverse CDF over the kept sorted candidates:
     the first index whose cumulative weight exceeds ``u * total``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, Sequence

import numpy as np

from crucible.step.quick_init import quick_init
from crucible.engine.rng import uniform
from crucible.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None  # None: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()  # text-level; the output text ends before the stop string
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    seed: int | None = None  # None: the engine derives one per request (see rng.py)
    logprobs: int | None = None  # top-N per generated token (plus the sampled token)
    prompt_logprobs: int | None = None  # top-N per prompt token (plus the actual token)

    def __post_init__(self) -> None:
        # Accept lists/single strings for convenience; store tuples so params stay hashable.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        self._check()

    def _check(self) -> None:
        def bad(msg: str) -> RequestError:
            return RequestError(f"invalid SamplingParams: {msg}")

        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("max_tokens", "min_tokens", "top_k", "seed", "logprobs",
                          "prompt_logprobs") and v is not None:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise bad(f"{f.name} must be an int, got {v!r}")
        if self.max_tokens < 1:
            raise bad(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise bad(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise bad(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise bad(f"top_k must be >= 1 or None, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise bad(f"min_p must be in [0, 1], got {self.min_p}")
        if not (np.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise bad(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise bad(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop strings must be non-empty strings")
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0
               for t in self.stop_token_ids):
            raise bad("stop_token_ids must be non-negative ints")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 20:
                raise bad(f"{name} must be in [0, 20] or None, got {v}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def plain_greedy(self, num_output: int) -> bool:
        """True when ``sample_row`` is the argmax of the raw logits for the next token: greedy,
        no penalty, no stop id masked by min_tokens, no logprobs asked for."""
        return (self.temperature == 0 and self.repetition_penalty == 1.0
                and not self.presence_penalty and not self.frequency_penalty
                and num_output >= self.min_tokens and self.logprobs is None)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """f64 log-softmax of one row (the max is subtracted first; sum in numpy's fixed order)."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def top_candidates(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, ordered by (value desc, index asc); exact on ties."""
    n = values.shape[0]
    if k >= n:
        return np.argsort(-values, kind="stable")
    # Everything tied with the k-th value joins the candidate set, so ties resolve by id.
    kth = np.partition(values, n - k)[n - k]
    cand = np.flatnonzero(values >= kth)
    return cand[np.argsort(-values[cand], kind="stable")][:k]


def top_logprobs(logprobs: np.ndarray, n: int, token_id: int) -> dict[int, float]:
    """{token: logprob} for the top-n tokens in rank order, plus ``token_id`` if missing."""
    out = {int(t): float(logprobs[t]) for t in top_candidates(logprobs, n)} if n else {}
    out.setdefault(int(token_id), float(logprobs[token_id]))
    return out


def _penalize(x: np.ndarray, p: SamplingParams, prompt: Sequence[int],
              output: Sequence[int]) -> np.ndarray:
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(list(prompt) + list(output), dtype=np.int64))
        vals = x[seen]
        x[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if output and (p.presence_penalty or p.frequency_penalty):
        ids, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
        x[ids] -= p.presence_penalty + p.frequency_penalty * counts.astype(np.float64)
    return x


@quick_init  # one per host-sampled row per step
@dataclass(frozen=True)
class SampleResult:
    token_id: int
    logprobs: dict[int, float] | None  # None unless params.logprobs is set


def sample_row(logits: np.ndarray, params: SamplingParams, *, prompt: Sequence[int],
               output: Sequence[int], seed: int, stop_ids: Iterable[int]) -> SampleResult:
    """Pick the next token for one request from its row of logits (see module docstring)."""
    raw = np.asarray(logits, dtype=np.float64)
    x = _penalize(raw.copy(), params, prompt, output)
    if len(output) < params.min_tokens:
        masked = [t for t in stop_ids if 0 <= t < x.shape[0]]
        if masked:
            x[np.asarray(masked, dtype=np.int64)] = -np.inf
    if params.greedy:
        token = int(np.argmax(x))  # first maximum: the lowest id wins ties
    else:
        x = x / params.temperature
        order = top_candidates(x, params.top_k or x.shape[0])
        xs = x[order]
        w = np.exp(xs - xs[0])  # relative weights, the best candidate is exactly 1
        keep = w.shape[0]
        if params.top_p < 1.0:
            cum = np.cumsum(w / w.sum())
            keep = min(keep, int(np.searchsorted(cum, params.top_p, side="left")) + 1)
        if params.min_p > 0.0:
            # w is non-increasing, so the kept set is a prefix; the top token always stays.
            keep = min(keep, max(1, int(np.count_nonzero(w[:keep] >= params.min_p))))
        cum = np.cumsum(w[:keep])
        idx = int(np.searchsorted(cum, uniform(seed, len(output)) * cum[-1], side="right"))
        token = int(order[min(idx, keep - 1)])
    lp = None
    if params.logprobs is not None:
        lp = top_logprobs(log_softmax(raw), params.logprobs, token)
    return SampleResult(token, lp)
