"""Pipelined decode (crucible/engine/pipeline.py), on the CPU with a fake device.

``FeedRunner`` behaves like the GPU runner: ``launch_sample`` queues a step and a pending
result; a fed step's rows carry placeholder id 0 and take their real input ids from the
previous launch's sampled ids, which only the "device" knows (the fake resolves them from
its own record, never from the engine). So an engine that planned a row wrongly (position,
page, draw counter, feed index) writes a wrong token into the fake's token pool or draws
with a wrong counter, and the generated tokens change.

Every request's output (ids, text, logprobs, finish reason) must equal the engine's without
pipelining; pages must all come back; and the pipeline must actually run.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from crucible.step.batch import pack_decodes
from crucible.step.rows import SampleOutput
from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from engine_fakes import FakeRunner, fake_tokenizer
from sampler_twin import NumpyTwinSampler

VOCAB = 97
EOS = 3


class _Pending:
    def __init__(self, result) -> None:
        self._result = result

    def result(self):
        return self._result


class FeedRunner(FakeRunner):
    chain_rows = 8
    mixed_feed_rows = 1  # any fed step, prefill slices and all

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.sampler = NumpyTwinSampler()
        self._last_ids: tuple[int, ...] = ()
        self.num_fed = 0
        self.num_fed_mixed = 0
        self.engine = None  # when set: fed batches are checked against the packer's

    def launch_sample(self, batch, rows, host_rows=(), feed=None):
        if feed is not None:
            feed = np.asarray(feed)
            assert batch.num_rows == len(feed) and feed.max() < len(self._last_ids)
            one_row = np.zeros(batch.num_rows, bool)
            one_row[batch.segments[batch.segments[:, 1] == 1, 0]] = True
            assert one_row[feed >= 0].all(), "only decode rows are fed"
            if (batch.segments[:, 1] > 1).any():  # a pipelined mixed step
                assert self.mixed_feed_rows is not None
                assert batch.num_rows >= self.mixed_feed_rows, "a fed step too small"
                self.num_fed_mixed += 1
            elif self.engine is not None and (feed >= 0).all():
                # the decode chain's columns make what the packer makes
                reqs = [self.engine.requests[r] for r in batch.request_ids]
                want = pack_decodes(batch.request_ids, batch.positions.tolist(),
                                    [r.page_table.pages for r in reqs])
                assert all(np.array_equal(getattr(batch, f.name), getattr(want, f.name))
                           for f in dataclasses.fields(want))
            assert (batch.token_ids[feed >= 0] == 0).all(), "fed rows carry id 0"
            ids = batch.token_ids.copy()
            ids[feed >= 0] = np.asarray(self._last_ids)[feed[feed >= 0]]
            batch = dataclasses.replace(batch, token_ids=ids)
            self.num_fed += 1
        logits = self.forward(batch)
        out = self.sampler.sample(logits, rows) if rows else SampleOutput((), ())
        self._last_ids = out.token_ids
        return _Pending((out, self.sampler.rows_to_host(logits, host_rows)))


def params_mix(n: int, kind: str) -> list[SamplingParams]:
    kinds = {
        "greedy": [dict(temperature=0.0)],
        "random": [dict(temperature=0.9, top_k=20), dict(temperature=1.2, top_p=0.8),
                   dict(temperature=0.7, logprobs=3),
                   dict(temperature=1.0, stop_token_ids=tuple(range(10, 40)))],
        "mixed": [dict(temperature=0.0, logprobs=2),
                  dict(temperature=0.9, top_k=20, prompt_logprobs=2),
                  dict(temperature=1.1, repetition_penalty=1.3),
                  dict(temperature=0.8, min_tokens=4, stop_token_ids=(5, 6)),
                  dict(temperature=1.0, ignore_eos=True, stop=("zz",)),
                  dict(temperature=1.0, stop_token_ids=tuple(range(10, 40)))],
    }[kind]
    return [SamplingParams(max_tokens=3 + (7 * i) % 23, seed=None if i % 3 else 11 + i,
                           **kinds[i % len(kinds)]) for i in range(n)]


def per_request(eng: LLMEngine, prompts, params, abort_at=None, add_at=None):
    """Run to completion: {request id: (ids, logprobs, finished flags, reasons)}."""
    out: dict[str, list] = {}
    for p, sp in zip(prompts, params):
        out[eng.add_request(p, sp)] = []
    step = 0
    while eng.has_unfinished():
        for d in eng.step():
            out[d.request_id].append((d.new_token_ids, d.new_logprobs, d.new_text,
                                      d.finished, d.finish_reason))
        step += 1
        for rid in (abort_at or {}).get(step, ()):
            eng.abort(rid)
        for p, sp in (add_at or {}).get(step, ()):
            out[eng.add_request(p, sp)] = []
    flat = {}
    for rid, ds in out.items():
        ids = tuple(t for d in ds for t in d[0])
        lps = tuple(x for d in ds if d[1] for x in d[1])
        text = "".join(d[2] for d in ds)
        flat[rid] = (ids, lps, text, [d[4] for d in ds if d[3]])
    return flat


@pytest.mark.parametrize("kind", ["greedy", "random", "mixed"])
@pytest.mark.parametrize("pages, budget", [(64, 1024), (7, 32)])  # (7, 32): preemption
def test_pipelined_engine_equals_plain_engine(kind, pages, budget):
    rng = np.random.default_rng(pages + len(kind))
    prompts = [rng.integers(0, VOCAB, int(rng.integers(1, 30))).tolist() for _ in range(6)]
    params = params_mix(6, kind)
    later = [(rng.integers(0, VOCAB, 9).tolist(), params[0])]
    cfg = SchedulerConfig(token_budget=budget)
    fed = FeedRunner(pages, vocab_size=VOCAB)
    eng = fed.engine = LLMEngine(fed, fake_tokenizer(EOS), cfg)
    got = per_request(eng, prompts, params, {3: ["req-2"]}, {5: later})
    plain = FeedRunner(pages, vocab_size=VOCAB)
    plain.chain_rows = 0  # the same runner, never pipelined
    want = per_request(LLMEngine(plain, fake_tokenizer(EOS), cfg), prompts, params,
                       {3: ["req-2"]}, {5: later})
    assert got == want
    assert plain.num_fed == 0 and eng.num_chained >= fed.num_fed > 0  # some need no feed
    assert eng.allocator.num_free == pages  # every page came back, dropped rows included
    assert any(r[3] == ["stop"] for r in want.values()) or kind == "greedy"


def test_pipeline_waits_for_rows_it_cannot_plan():
    """Penalties read the token the pipeline does not have yet: no fed step for them, and
    a step that must wait for admission, more rows than a graph, or no free page is not
    chained either."""
    p = [SamplingParams(max_tokens=12, temperature=0.8, repetition_penalty=1.2, seed=1)]
    runner = FeedRunner(32, vocab_size=VOCAB)
    eng = LLMEngine(runner, None)
    per_request(eng, [[1, 2, 3]], p)
    assert eng.num_chained == 0

    runner = FeedRunner(64, vocab_size=VOCAB)
    runner.chain_rows = 2  # three requests never fit a fed step
    eng = LLMEngine(runner, None)
    per_request(eng, [[1, 2], [3, 4], [5, 6]], [SamplingParams(max_tokens=6, temperature=0.0)] * 3)
    assert eng.num_chained == 0


def test_stopped_request_drops_its_queued_row():
    """A request that stops on a stop id has one more row queued; it is computed and dropped:
    no extra token, and its pages come back."""
    runner = FeedRunner(16, vocab_size=VOCAB)
    eng = LLMEngine(runner, fake_tokenizer(EOS))
    params = SamplingParams(max_tokens=200, temperature=1.5, seed=4)
    rid = eng.add_request([9, 8, 7], params)
    ids, reasons = [], []
    while eng.has_unfinished():
        for d in eng.step():
            ids += d.new_token_ids
            if d.finished:
                reasons.append(d.finish_reason)
    assert reasons == ["stop"] and ids[-1] == EOS and EOS not in ids[:-1]
    assert eng.num_rows == eng.num_generated + 3 - 1 + 1  # prompt rows + one dropped row
    assert eng.allocator.num_free == 16 and rid not in eng.requests


def test_pipelined_decode_publishes_the_pages_it_completes():
    """A page that a pipelined decode step fills is published when that step's results are
    applied, as without pipelining (not later): a prompt made of the first request's
    prompt and output, sent while it still runs, finds the same pages cached."""
    from types import SimpleNamespace

    from crucible.engine.prefix_cache import PrefixCache

    prompt = list(range(20, 40))  # 20 tokens: pages 1 and 2 fill during the decode
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)

    def run(chain_rows: int):
        runner = FeedRunner(64, vocab_size=VOCAB)
        runner.chain_rows = chain_rows
        runner.backend = SimpleNamespace(arithmetic="fake")
        cache = PrefixCache(("t",), "fake", 64)
        eng = LLMEngine(runner, fake_tokenizer(EOS), prefix_cache=cache)
        first = eng.add_request(prompt, params)
        out: dict[str, list[int]] = {first: []}
        published = []  # pages published after each step, until the second arrives
        while eng.has_unfinished():
            for d in eng.step():
                out[d.request_id] += d.new_token_ids
            if len(out) == 1:
                published.append(cache.stats.admissions)
                if len(out[first]) >= 36:
                    out[eng.add_request(prompt + out[first][:30], params)] = []
        return published, out, cache.stats.hit_tokens, eng.num_chained

    plain, piped = run(0), run(8)
    assert piped[:3] == plain[:3]
    assert plain[0][-1] == 3
    assert plain[2] == 48 and plain[3] == 0 < piped[3]  # 3 pages, 2 filled by decodes
