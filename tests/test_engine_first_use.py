"""A planned step whose launch is a graph's first use waits for the step before it to be
collected (``LLMEngine.step``, ``runner.first_use``).

On the GPU such a launch (a capture, or an eager forward of a shape no graph holds yet)
keeps the host for 7-45 ms; launched ahead as usual, it held back the tokens of the step in
flight, often a whole chat cohort's first tokens (docs/prefix-cache.md). Deferred, those
tokens go out first and the next ``step()`` launches the planned step. Its fed rows then
read the previous step's ids from the device after the host read them too, and rows of
requests that step ended are dropped as before. Here on the CPU with ``FeedRunner``'s fake
device: every output equals the plain engine's, pages all come back, and the order of
launches and returns is the one described.
"""

from __future__ import annotations

import pytest

from crucible.engine.engine import LLMEngine
from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from engine_fakes import fake_tokenizer
from test_engine_pipeline import EOS, VOCAB, FeedRunner, per_request
from test_engine_pipeline_mixed import workload


class FirstUseRunner(FeedRunner):
    """Says every ``every``-th planned mixed step (a slice of more rows than one) is a
    first use; logs launches, so a test can see what ran when."""

    def __init__(self, *args, every: int = 1, **kw) -> None:
        super().__init__(*args, **kw)
        self.every, self.asked, self.deferred_fed = every, 0, 0
        self.launched: list = []  # batches, in launch order

    def first_use(self, batch, fed: bool) -> bool:
        if not (batch.segments[:, 1] > 1).any():
            return False
        self.asked += 1
        new = self.asked % self.every == 0
        self.deferred_fed += new and fed
        return new

    def launch_sample(self, batch, rows, host_rows=(), feed=None):
        self.launched.append(batch)
        return super().launch_sample(batch, rows, host_rows, feed)


def make(pages: int, sched: SchedulerConfig, every: int = 1, cache: bool = False,
         chain: bool = True) -> LLMEngine:
    runner = FirstUseRunner(pages, vocab_size=VOCAB, every=every)
    runner.chain_rows = 64 if chain else 0
    prefix = None
    if cache:
        from types import SimpleNamespace

        runner.backend = SimpleNamespace(arithmetic="fake")
        prefix = PrefixCache(("t",), "fake", pages)
    return LLMEngine(runner, fake_tokenizer(EOS), sched, prefix_cache=prefix)


@pytest.mark.parametrize("kind", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("pages, budget, cap", [(256, 64, None), (12, 24, 8)])
def test_deferred_first_uses_equal_the_plain_engine(kind, every, pages, budget, cap):
    wl = workload(pages + budget + every, 20, kind)
    sched = SchedulerConfig(token_budget=budget, chunk_cap=cap, max_running=8)
    eng = make(pages, sched, every)
    got = per_request(eng, *wl[:2], None, wl[2])
    assert got == per_request(make(pages, sched, chain=False), *wl[:2], None, wl[2])
    assert eng.allocator.num_free == pages
    runner = eng.runner  # deferred exactly when told, fed steps among them
    assert runner.asked > 0 and eng.num_deferred == runner.asked // every
    assert runner.deferred_fed > 0 or every > 1
    # Aborts after a given call: which rows an aborted request got depends on what was
    # planned ahead, so the reference is the pipelined engine that never defers.
    aborts = {4: ["req-3"], 9: ["req-11", "req-12"]}
    eng = make(pages, sched, every)
    got = per_request(eng, *wl[:2], aborts, wl[2])
    assert got == per_request(make(pages, sched, every=10**9), *wl[:2], aborts, wl[2])
    assert eng.num_deferred == eng.runner.asked // every and eng.allocator.num_free == pages


def test_deferred_first_uses_with_the_prefix_cache_equal_cold():
    from test_prefix_cache import check_invariants

    wl = workload(5, 24, "random", shared=True, head_len=70)
    sched = SchedulerConfig(token_budget=64, chunk_cap=24, max_running=6)
    eng = make(96, sched, every=2, cache=True)
    step = eng.step
    eng.step = lambda: (out := step(), check_invariants(eng))[0]
    got = per_request(eng, *wl[:2], None, wl[2])
    assert got == per_request(make(96, sched, chain=False), *wl[:2], None, wl[2])
    assert eng.num_deferred > 0 and eng.cache_stats()["cache_hit_tokens"] > 0
    assert eng.allocator.num_free == 96


def test_the_step_in_flight_returns_before_a_first_use_launches():
    """A call that defers returns with nothing in flight and the planned step unlaunched;
    the next call launches exactly that batch before planning anything else."""
    sched = SchedulerConfig(token_budget=64, max_running=8)
    eng = make(128, sched)
    runner = eng.runner
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for i in range(3):
        eng.add_request([5 + i] * 20, p)
    seen = calls = 0
    while eng.has_unfinished():
        calls += 1
        if calls in (2, 5):  # beside the decodes: the next planned step is mixed
            eng.add_request([8] * (17 + calls), p)
        if eng.step() and eng._deferred is not None:
            seen += 1
            planned, n = eng._deferred, len(runner.launched)
            assert eng._inflight is None
            assert all(b is not planned.batch for b in runner.launched)
            eng.add_request([9] * 30, p)  # arrives between the calls: joins a later step
            eng.step()
            assert runner.launched[n] is planned.batch
    assert seen >= 2 and eng.allocator.num_free == 128


def test_a_deferred_step_of_aborted_requests_is_dropped():
    sched = SchedulerConfig(token_budget=64, max_running=8)
    eng = make(128, sched)
    p = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    rids = [eng.add_request([7 + i] * 20, p) for i in range(2)]
    while eng._deferred is None:
        eng.step()
        if len(eng.requests) < len(rids) + 1 and eng.num_deferred == 0:
            rids.append(eng.add_request([11] * 25, p))  # a prompt beside decodes: mixed
    for rid in list(eng.requests):
        eng.abort(rid)
    n = len(eng.runner.launched)
    assert eng.step() == [] and len(eng.runner.launched) == n  # nothing was launched
    assert eng._deferred is None and eng.allocator.num_free == 128
    # The engine goes on: a new request's output is a fresh engine's.
    q = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    got = per_request(eng, [[4] * 18], [q])
    assert list(got.values()) == list(per_request(make(128, sched), [[4] * 18], [q]).values())
