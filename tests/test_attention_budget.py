"""The scheduler's attention budget (SchedulerConfig.attention_budget): slices after a step's
first are cut to the positions left, plain and pipelined, with outputs unchanged.

A step's attended positions: a row at position p attends p + 1 of them, so a slice of n rows
from ``start`` attends ``n * start + n (n + 1) / 2``. Every batch must keep its total within
the budget plus its largest segment (the uncut first slice), and a cohort of prompts that fits
one step's rows must be spread over several when the budget says so.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig, attended, rows_within
from crucible.errors import ConfigError
from engine_fakes import FakeRunner, fake_tokenizer
from test_engine_pipeline import EOS, VOCAB, FeedRunner, params_mix, per_request


def test_rows_within_is_the_largest_fitting_slice():
    rng = random.Random(0)
    cases = [(0, 1), (0, 3), (5, 5), (5, 6), (0, 0), (7, -4)]
    cases += [(rng.randint(0, 9000), rng.randint(-5, 10**8)) for _ in range(5000)]
    for start, left in cases:
        n = rows_within(start, left)
        if left <= 0:
            assert n == 0
        else:
            assert attended(start, n) <= left < attended(start, n + 1), (start, left, n)
    assert attended(10, 3) == 11 + 12 + 13


class Recorder:
    """Every batch's rows and attention, checked against the budget as it launches: the
    leading one-row segments are decode rows (never cut), the next segment is the step's
    first slice (never cut); any slice after it must keep the whole step within budget."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.steps: list[tuple[int, int, int]] = []  # (rows, segments of > 1 row, attended)

    def __call__(self, batch) -> None:
        segs = batch.segments.tolist()
        per = [attended(abs_start, n) for _, n, abs_start, _ in segs]
        self.steps.append((batch.num_rows, sum(n > 1 for _, n, _, _ in segs), sum(per)))
        decodes = next((i for i, s in enumerate(segs) if s[1] > 1), len(segs))
        if self.budget is not None and len(segs) > decodes + 1:
            assert sum(per) <= self.budget, (per[:decodes + 1], sum(per), self.budget)


def cohort(attention_budget: int | None, runner_cls=FakeRunner):
    """Two long requests decoding, then 12 prompts of 100 tokens arriving at once."""
    rec = Recorder(attention_budget)
    runner = runner_cls(512, vocab_size=VOCAB, on_batch=rec)
    if runner_cls is FeedRunner:
        runner.chain_rows, runner.mixed_feed_rows = 64, 1
    sched = SchedulerConfig(token_budget=2048, max_running=32,
                            attention_budget=attention_budget)
    eng = LLMEngine(runner, fake_tokenizer(EOS), sched)
    rng = np.random.default_rng(4)
    long = [rng.integers(0, VOCAB, 400).tolist() for _ in range(2)]
    late = [rng.integers(0, VOCAB, 100).tolist() for _ in range(12)]
    greedy = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 14
    out = per_request(eng, long, greedy[:2], add_at={3: list(zip(late, greedy[2:]))})
    assert eng.allocator.num_free == 512
    return out, rec


@pytest.mark.parametrize("runner_cls", [FakeRunner, FeedRunner], ids=["plain", "pipelined"])
def test_a_cohort_is_spread_over_steps_with_the_same_outputs(runner_cls):
    free, rec_free = cohort(None, runner_cls)
    cut, rec_cut = cohort(20_000, runner_cls)
    assert cut == free  # every kernel is batch-invariant: where a slice runs changes no bit
    # without a budget the 12 prompts share one step; with it they take four: three full
    # slices a step, beside the rest of the part cut last time and a part of the next
    assert max(s[1] for s in rec_free.steps) == 12
    assert [s[1] for s in rec_cut.steps if s[1]] == [1, 1, 4, 5, 5, 1]
    assert all(s[2] <= 20_000 for s in rec_cut.steps if s[1] > 1)
    # the first cohort step: two decode rows (~401 positions each), one uncut slice (5,050),
    # two more (10,100), then an 89-row part of the fourth that fits the 4,100 or so left
    first = next(s for s in rec_cut.steps if s[1] > 1)
    assert first[0] == 2 + 300 + 89
    assert len(rec_cut.steps) > len(rec_free.steps)


def test_a_step_always_makes_progress():
    """A budget below one decode row's history: every step still takes its first slice, so
    prompts are computed one slice a step beside the decodes and everything finishes."""
    out, rec = cohort(1)
    assert all(len(ids) == 12 for ids, *_ in out.values())
    assert max(s[1] for s in rec.steps) == 1


@pytest.mark.parametrize("kind", ["greedy", "random"])
def test_pipelined_steps_keep_the_budget_and_the_outputs(kind):
    """Random arrivals with a pipelined runner: every batch within the budget (the fed plan
    is cut as the scheduler's is), outputs equal the plain engine's under the same budget."""
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, VOCAB, int(rng.integers(2, 90))).tolist() for _ in range(20)]
    params = params_mix(20, kind)
    later = {1 + i // 3: [(prompts[i], params[i])] for i in range(4, 20)}
    got = {}
    for chain in (True, False):
        rec = Recorder(3000)
        runner = FeedRunner(256, vocab_size=VOCAB, on_batch=rec)
        runner.chain_rows, runner.mixed_feed_rows = (64, 1) if chain else (0, None)
        sched = SchedulerConfig(token_budget=96, max_running=10, attention_budget=3000)
        eng = LLMEngine(runner, fake_tokenizer(EOS), sched)
        got[chain] = per_request(eng, prompts[:4], params[:4], add_at=later)
        assert eng.allocator.num_free == 256
        if chain:
            assert runner.num_fed_mixed > 0
    assert got[True] == got[False]


def test_bad_budgets_are_refused():
    with pytest.raises(ConfigError, match="attention_budget"):
        SchedulerConfig(attention_budget=0)
    from crucible.engine.settings import Settings

    assert Settings.from_env({"CRUCIBLE_ATTENTION_BUDGET": "0"}).scheduler_config() \
        .attention_budget is None
    for raw in ("-1", "1e6", "lots"):
        with pytest.raises(ConfigError, match="CRUCIBLE_ATTENTION_BUDGET"):
            Settings.from_env({"CRUCIBLE_ATTENTION_BUDGET": raw})


def test_chat_turns_with_the_cache_keep_their_bits():
    """The tiny model on the CPU, a second chat turn of 10 users after a shared system
    prompt, all cached but their new messages: cut over more steps by the budget, every
    token and logprob equals the run without a budget and the cold run."""
    import struct

    from crucible import LLM
    from crucible.engine.settings import Settings
    from crucible.model.tiny import tiny_random_model

    model = tiny_random_model(seed=4, max_context=2048)
    v = model.config.vocab_size
    rng = np.random.default_rng(8)
    system = rng.integers(0, v, 300).tolist()
    first = [system + rng.integers(0, v, 40).tolist() for _ in range(10)]
    params = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.9, seed=3, logprobs=2)

    def run(**kw):
        llm = LLM(model, settings=Settings(device="cpu", num_pages=600, **kw))
        replies = llm.generate(first, params)
        second = [p + list(r.token_ids) + rng2.integers(0, v, 30).tolist()
                  for p, r, rng2 in zip(first, replies, gens())]
        steps = llm.engine.num_steps
        out = llm.generate(second, params)
        bits = [(o.token_ids, [[(t, struct.pack("<d", x)) for t, x in lp.items()]
                               for lp in o.logprobs]) for o in out]
        assert llm.engine.allocator.num_free == 600
        return bits, llm.engine.num_steps - steps, sum(o.num_cached_tokens for o in out)

    def gens():
        return [np.random.default_rng(100 + i) for i in range(10)]

    free, steps_free, hit_free = run()
    cut, steps_cut, hit_cut = run(attention_budget=40_000)
    cold, _, hit_cold = run(prefix_cache_size=0, attention_budget=40_000)
    assert hit_free == hit_cut > 10 * 300 and hit_cold == 0
    assert cut == free == cold
    assert steps_cut > steps_free  # the turn really was spread out
