"""The engine's device-sampling path, run on the CPU through the numpy twin sampler.

With ``runner.sampler`` set, ``LLMEngine.step`` sends RowSampling metadata to
``runner.forward_sample`` and gets only ids (and requested logprobs) back; prompt-logprob rows
come back as host logits. Every delta (ids, text, logprobs, prompt logprobs, finish reasons)
and the stats must equal the host-sampling engine's, on a fake runner with preemption and
aborts and on the tiny model.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.step.rows import SampleOutput
from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import tiny_random_model
from crucible.engine.runner import PendingStep
from engine_fakes import FakeRunner, fake_tokenizer
from sampler_twin import NumpyTwinSampler

VOCAB = 97
EOS = 3


class TwinFakeRunner(FakeRunner):
    """FakeRunner with a device sampler: the interface ModelRunner offers on the GPU."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.sampler = NumpyTwinSampler()

    def launch_sample(self, batch, rows, host_rows=(), feed=None):
        assert feed is None  # chain_rows is 0: the engine never feeds a step
        logits = self.forward(batch)
        out = self.sampler.sample(logits, rows) if rows else SampleOutput((), ())
        return PendingStep(None, out, self.sampler.rows_to_host(logits, host_rows))


def mixed_params(n: int) -> list[SamplingParams]:
    kinds = [dict(temperature=0.0, logprobs=2),
             dict(temperature=0.9, top_k=20, prompt_logprobs=3),
             dict(temperature=1.3, top_p=0.7, min_p=0.02, repetition_penalty=1.3, logprobs=0),
             dict(temperature=0.7, presence_penalty=0.8, frequency_penalty=0.4, min_tokens=3,
                  stop_token_ids=(5, 6), prompt_logprobs=0, logprobs=5),
             dict(temperature=1.0, ignore_eos=True)]
    return [SamplingParams(max_tokens=2 + i % 9, seed=None if i % 4 else 40 + i,
                           **kinds[i % len(kinds)]) for i in range(n)]


def drive(eng: LLMEngine, prompts, params, abort_at: dict[int, str] | None = None):
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    deltas, step = [], 0
    while eng.has_unfinished():
        deltas.append(eng.step())
        step += 1
        for rid in (abort_at or {}).get(step, ()):
            eng.abort(rid)
    return ids, deltas, eng.stats()


@pytest.mark.parametrize("pages, budget", [(64, 1024), (6, 24)])  # (6, 24): preemption
def test_fake_runner_device_path_equals_host_path(pages, budget):
    rng = np.random.default_rng(pages)
    prompts = [rng.integers(0, VOCAB, int(rng.integers(1, 40))).tolist() for _ in range(14)]
    params = mixed_params(14)
    cfg = SchedulerConfig(token_budget=budget)
    twin = TwinFakeRunner(pages, vocab_size=VOCAB)
    got = drive(LLMEngine(twin, fake_tokenizer(EOS), cfg), prompts, params, {2: ["req-1"]})
    want = drive(LLMEngine(FakeRunner(pages, vocab_size=VOCAB), fake_tokenizer(EOS), cfg),
                 prompts, params, {2: ["req-1"]})
    assert got == want
    assert twin.sampler.num_rows == got[2]["tokens_generated"] > 0
    if budget < 1024:
        assert got[2]["preemptions"] > 0


def test_tiny_model_device_path_equals_host_path():
    model = tiny_random_model(seed=2)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, model.config.vocab_size, int(rng.integers(1, 50))).tolist()
               for _ in range(10)]
    params = mixed_params(10)
    dev = ModelRunner(model, num_pages=48, device="cpu")
    assert dev.sampler is None  # the CPU keeps the host sampler unless a test installs one
    dev.sampler = NumpyTwinSampler()
    host = ModelRunner(model, num_pages=48, device="cpu")
    got = drive(LLMEngine(dev, model.tokenizer), prompts, params)
    want = drive(LLMEngine(host, model.tokenizer), prompts, params)
    assert got == want
    assert dev.sampler.num_rows == got[2]["tokens_generated"]


def test_forward_sample_needs_a_sampler_and_right_shapes():
    model = tiny_random_model(seed=2)
    runner = ModelRunner(model, num_pages=8, device="cpu", device_sampling=True)
    from crucible.step.batch import SegmentSpec, build_packed_batch

    batch = build_packed_batch([SegmentSpec("a", [1, 2, 3], 0, [0], [1, 2])])
    with pytest.raises(RuntimeError, match="no device sampler"):
        runner.forward_sample(batch, [])
    runner.sampler = NumpyTwinSampler()
    out, host = runner.forward_sample(batch, [], host_rows=[1, 0])
    assert out.token_ids == () and host.shape == (2, model.config.vocab_size)
    want = runner.forward(batch)
    assert np.array_equal(host, want[[1, 0]])
