"""The host path's batched argmax gives exactly the per-row sampler's tokens."""

from __future__ import annotations

import numpy as np

from crucible.engine import step_rows
from crucible.engine.engine import LLMEngine
from crucible.engine.runner import ModelRunner
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.model.tiny import tiny_random_model

KINDS = [dict(temperature=0.0), dict(temperature=0.0, logprobs=2),
         dict(temperature=0.0, repetition_penalty=1.3), dict(temperature=0.0, min_tokens=4),
         dict(temperature=0.0, presence_penalty=0.5), dict(temperature=0.9, top_k=5)]


def _run(model, batch_greedy: bool) -> list[tuple[int, ...]]:
    engine = LLMEngine(ModelRunner(model, num_pages=256), model.tokenizer,
                       SchedulerConfig(max_queue=64))
    if not batch_greedy:  # the --profile path: every draw runs sample_row on its own
        engine.stage_timer = lambda stage, fn: fn()
    rng = np.random.default_rng(3)
    out: dict[str, list[int]] = {}
    for i in range(24):
        prompt = rng.integers(0, model.config.vocab_size, int(rng.integers(3, 40))).tolist()
        params = SamplingParams(max_tokens=12, ignore_eos=True, seed=i,
                                stop_token_ids=(7,), **KINDS[i % len(KINDS)])
        out[engine.add_request(prompt, params)] = []
    while engine.has_unfinished():
        for d in engine.step():
            out[d.request_id] += d.new_token_ids
    return [tuple(v) for v in out.values()]


def test_batched_argmax_equals_the_row_sampler(monkeypatch) -> None:
    model = tiny_random_model(seed=11)
    calls = []
    real = step_rows.sample_host
    monkeypatch.setattr(step_rows, "sample_host", lambda *a: calls.append(1) or real(*a))
    batched = _run(model, True)
    n_batched = len(calls)
    calls.clear()
    per_row = _run(model, False)
    assert batched == per_row
    # Plain greedy rows (a sixth of the requests) skipped sample_row in the batched run.
    assert len(calls) == 24 * 12 and n_batched < len(calls) - 4 * 12
