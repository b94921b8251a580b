"""Pipelined mixed steps (crucible/engine/pipeline_next.py), on the CPU with a fake device.

``FeedRunner`` (test_engine_pipeline.py) resolves a fed row's input id from the previous
launch's sampled ids, which only the "device" knows; its logits depend on each request's
own history in the fake's token pool. So a wrongly planned row (position, page, draw
counter, feed index, a row dropped or doubled) changes the generated tokens. The workloads
here keep prompts arriving while others decode, so most steps are mixed, and every
request's output must equal the engine's without pipelining, with every page back.
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.engine.engine import LLMEngine
from crucible.engine.prefix_cache import PrefixCache
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from engine_fakes import fake_tokenizer
from test_engine_pipeline import EOS, VOCAB, FeedRunner, params_mix, per_request


def workload(seed: int, n: int, kind: str, shared: bool = False, head_len: int = 37):
    """Prompts, params, and arrivals spread over the first steps (step -> [(prompt, params)])."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, VOCAB, head_len).tolist()
    prompts = [(head if shared and i % 2 else []) + rng.integers(0, VOCAB, int(rng.integers(1, 60))).tolist()
               for i in range(n)]
    params = params_mix(n, kind)
    first = max(2, n // 4)
    later: dict[int, list] = {}
    for i in range(first, n):
        later.setdefault(1 + (i - first) // 2, []).append((prompts[i], params[i]))
    return prompts[:first], params[:first], later


def run(runner_cfg: dict, sched: SchedulerConfig, wl, aborts=None, cache: bool = False,
        chain: bool = True):
    pages = runner_cfg["pages"]
    runner = FeedRunner(pages, vocab_size=VOCAB)
    runner.chain_rows = runner_cfg.get("chain_rows", 64) if chain else 0
    runner.mixed_feed_rows = runner_cfg.get("mixed_feed_rows", 1)
    prefix = None
    if cache:
        from types import SimpleNamespace

        runner.backend = SimpleNamespace(arithmetic="fake")
        prefix = PrefixCache(("t",), "fake", pages)
    eng = LLMEngine(runner, fake_tokenizer(EOS), sched, prefix_cache=prefix)
    if cache:  # the page invariants after every step, a step in flight or not
        from test_prefix_cache import check_invariants

        step = eng.step
        eng.step = lambda: (out := step(), check_invariants(eng))[0]
    prompts, params, later = wl
    got = per_request(eng, prompts, params, aborts, later)
    assert eng.allocator.num_free == pages  # every page came back (cached ones evictable)
    return got, eng, runner


@pytest.mark.parametrize("kind", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("pages, budget, cap", [(256, 64, None), (256, 48, 16), (12, 24, 8)])
def test_pipelined_mixed_steps_equal_the_plain_engine(kind, pages, budget, cap):
    wl = workload(pages + budget, 20, kind)
    sched = SchedulerConfig(token_budget=budget, chunk_cap=cap, max_running=8)
    aborts = {4: ["req-3"], 9: ["req-11", "req-12"]}
    got, eng, runner = run({"pages": pages}, sched, wl, aborts)
    want, plain, _ = run({"pages": pages}, sched, wl, aborts, chain=False)
    assert got == want
    assert plain.num_chained == 0 and runner.num_fed_mixed > 0


def test_mixed_steps_with_the_prefix_cache_equal_cold():
    """Admissions planned ahead map cached pages (fewer, maybe: step t's pages are not
    published yet); outputs equal a cold engine's, and the cache is used."""
    wl = workload(5, 24, "random", shared=True)
    sched = SchedulerConfig(token_budget=64, chunk_cap=24, max_running=6)
    got, eng, runner = run({"pages": 96}, sched, wl, cache=True)
    want, _, _ = run({"pages": 96}, sched, wl, chain=False)
    assert got == want
    assert runner.num_fed_mixed > 0 and eng.cache_stats()["cache_hit_tokens"] > 0


def test_waits_for_a_prefix_being_filled_in_pipelined_steps_equal_cold():
    """A shared head of 8 pages: requests arriving while it is being computed wait for it
    (engine/filling.py), planned ahead by the pipeline too, where the filler's pages of
    the step in flight are not published yet; outputs equal a cold engine's, with the
    page invariants after every step."""
    wl = workload(6, 24, "random", shared=True, head_len=130)
    sched = SchedulerConfig(token_budget=64, chunk_cap=24, max_running=6)
    got, eng, runner = run({"pages": 160}, sched, wl, cache=True)
    want, _, _ = run({"pages": 160}, sched, wl, chain=False)
    assert got == want
    stats = eng.cache_stats()
    assert runner.num_fed_mixed > 0 and stats["cache_fill_waits"] > 0
    # 12 requests share the head: all but the first map its 8 pages (without the waits,
    # 1,200 of these 1,408 tokens, and ~20% more rows computed)
    assert stats["cache_hit_tokens"] == 11 * 8 * 16
    assert len(eng.scheduler.filling) == 0


def test_small_fed_mixed_steps_are_left_to_the_scheduler():
    """Below ``mixed_feed_rows`` a step with prefill slices and fed rows is not planned
    ahead (the CuPy backend replays a mixed graph for it after the results instead)."""
    wl = workload(9, 16, "greedy")
    sched = SchedulerConfig(token_budget=64, chunk_cap=8, max_running=6)
    got, eng, runner = run({"pages": 256, "mixed_feed_rows": 10_000}, sched, wl)
    want, _, _ = run({"pages": 256}, sched, wl, chain=False)
    assert got == want and runner.num_fed_mixed == 0 and eng.num_chained > 0


def test_penalty_rows_wait_for_their_token():
    """A row with a repetition penalty reads the token step t samples: no step holding it
    is planned ahead, and the output still matches."""
    p = SamplingParams(max_tokens=9, temperature=0.9, repetition_penalty=1.3, seed=2)
    wl = ([[1, 2, 3]], [p], {1: [([4, 5, 6, 7], p)], 2: [([8] * 20, p)]})
    sched = SchedulerConfig(token_budget=16, chunk_cap=4)
    got, _, runner = run({"pages": 64}, sched, wl)
    want, _, _ = run({"pages": 64}, sched, wl, chain=False)
    assert got == want and runner.num_fed == 0


class MisfedRunner(FeedRunner):
    """Negative control: hands every fed row the id of the next sampled row."""

    def launch_sample(self, batch, rows, host_rows=(), feed=None):
        if feed is not None and len(self._last_ids) > 1:
            feed = np.where(np.asarray(feed) >= 0,
                            (np.asarray(feed) + 1) % len(self._last_ids), -1)
        return super().launch_sample(batch, rows, host_rows, feed)


def test_a_wrong_feed_changes_the_output():
    wl = workload(3, 16, "greedy")
    sched = SchedulerConfig(token_budget=64, chunk_cap=16, max_running=8)
    want, _, _ = run({"pages": 256}, sched, wl, chain=False)
    runner = MisfedRunner(256, vocab_size=VOCAB)
    runner.chain_rows, runner.mixed_feed_rows = 64, 1
    eng = LLMEngine(runner, fake_tokenizer(EOS), sched)
    prompts, params, later = wl
    assert per_request(eng, prompts, params, None, later) != want
