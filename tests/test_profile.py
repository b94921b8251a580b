"""--profile plumbing without a GPU: stages are timed where they run, sampling included."""

from __future__ import annotations

import numpy as np

from crucible.backend.profile import ProfiledBackend, ProfiledSampler
from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import tiny_random_model


class _CountingSampler:
    def __init__(self) -> None:
        self.calls = 0

    def sample(self, logits: np.ndarray, rows: list) -> str:
        self.calls += 1
        return "sampled"

    def rows_to_host(self, logits: np.ndarray, rows: list) -> np.ndarray:
        return np.asarray(logits)[list(rows)]


def test_profiled_sampler_times_the_launch_and_delegates() -> None:
    model = tiny_random_model(seed=0)
    pb = ProfiledBackend(ModelRunner(model, num_pages=8, device="cpu").backend)
    inner = _CountingSampler()
    wrapped = ProfiledSampler(inner, pb)
    assert wrapped.sample(np.zeros((1, 4)), []) == "sampled" and inner.calls == 1
    assert wrapped.rows_to_host(np.eye(3), [2]).tolist() == [[0.0, 0.0, 1.0]]
    assert "sampling" in pb.stage_ms()


def test_host_sampling_is_a_profiled_stage_and_changes_nothing() -> None:
    model = tiny_random_model(seed=0)
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=3)
    outs = []
    for profiled in (False, True):
        runner = ModelRunner(model, num_pages=16, device="cpu")
        if profiled:
            runner.backend = pb = ProfiledBackend(runner.backend)
        engine = LLMEngine(runner, model.tokenizer)
        if profiled:
            engine.stage_timer = pb.timed
        engine.add_request([1, 2, 3, 4], params)
        tokens: list[int] = []
        while engine.has_unfinished():
            for delta in engine.step():
                tokens += delta.new_token_ids
        outs.append(tokens)
        if profiled:
            ms = pb.stage_ms()
            assert ms["sampling"] > 0 and ms["attention"] > 0
    assert len(outs[0]) == 6 and outs[0] == outs[1]
