"""Scheduler invariants over random workloads (hypothesis), through the real engine loop.

The fake runner reads every row's history back through its page table, so any slice or
paging mistake also changes tokens; outputs are compared to a one-at-a-time reference.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from crucible.engine.engine import LLMEngine
from crucible.engine.pages import pages_for
from crucible.engine.request import RequestStatus
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import ScheduledSlice, SchedulerConfig
from crucible.errors import QueueFullError
from engine_fakes import FakeRunner, fake_tokenizer

VOCAB, EOS = 64, 3


def params(max_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.9, top_k=20, seed=seed)


def reference(prompts, max_tokens):
    """Each request alone in a roomy engine."""
    out = {}
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        eng = LLMEngine(FakeRunner(64, vocab_size=VOCAB), fake_tokenizer(EOS))
        eng.add_request(p, params(m, i), request_id=str(i))
        toks = []
        while eng.has_unfinished():
            for d in eng.step():
                toks.extend(d.new_token_ids)
        out[str(i)] = toks
    return out


class Checker:
    """Per-batch invariants, checked before the runner computes anything."""

    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.engine: LLMEngine | None = None
        self.last_end: dict[str, int] = {}
        self.preemptions: dict[str, int] = {}

    def __call__(self, batch):
        eng, cfg = self.engine, self.cfg
        assert 0 < batch.num_rows <= cfg.token_budget
        running = eng.scheduler.running
        assert len(running) <= cfg.max_running
        for (start, n, abs_start, t), rid in zip(batch.segments.tolist(), batch.request_ids):
            req = eng.requests[rid]
            assert req.status is RequestStatus.RUNNING
            if cfg.chunk_cap is not None:
                assert n <= cfg.chunk_cap
            # the slice continues exactly where the request's computed prefix ends
            assert abs_start == req.num_computed_tokens
            if abs_start != self.last_end.get(rid, 0):
                assert abs_start == 0 and req.num_preemptions > self.preemptions.get(rid, 0)
            self.last_end[rid] = abs_start + n
            self.preemptions[rid] = req.num_preemptions
            assert batch.token_ids[start : start + n].tolist() == req.token_ids[abs_start : abs_start + n]
            # the page table is exactly the request's pages, just enough for the slice end
            length = int(batch.table_lengths[t])
            assert batch.page_tables[t, :length].tolist() == req.page_table.pages
            assert length == pages_for(abs_start + n)
        # one-row slices of already-running requests (decodes) come first, then the rest
        decodes = [eng.requests[r].num_remaining == 1 and eng.requests[r].num_computed_tokens > 0
                   for r in batch.request_ids]
        assert decodes == sorted(decodes, reverse=True)
        # page accounting: running requests own pages, waiting ones none
        owned = [p for r in running for p in r.page_table.pages]
        assert len(owned) == len(set(owned))
        assert len(owned) + eng.allocator.num_free == eng.allocator.num_pages
        assert all(len(r.page_table) == 0 for r in eng.scheduler.waiting)


workloads = st.fixed_dictionaries({
    "prompts": st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=70),
                        min_size=1, max_size=10),
    "max_tokens": st.lists(st.integers(1, 12), min_size=10, max_size=10),
    "budget": st.integers(1, 96),
    "chunk_cap": st.none() | st.integers(1, 40),
    "extra_pages": st.integers(0, 12),
    "max_running": st.integers(1, 6),
    "max_queue": st.integers(1, 6),
    "arrivals": st.lists(st.integers(0, 6), min_size=10, max_size=10),
    "aborts": st.lists(st.tuples(st.integers(0, 30), st.integers(0, 9)), max_size=3),
})


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads)
def test_scheduler_invariants_random_workloads(w):
    prompts = w["prompts"]
    n = len(prompts)
    max_tokens = w["max_tokens"][:n]
    # the pool must hold any one request alone; beyond that it may be tight (preemption)
    need = max(pages_for(len(p) + m - 1) for p, m in zip(prompts, max_tokens))
    num_pages = need + w["extra_pages"]
    cfg = SchedulerConfig(token_budget=w["budget"], chunk_cap=w["chunk_cap"],
                          max_running=w["max_running"], max_queue=w["max_queue"])
    check = Checker(cfg)
    eng = LLMEngine(FakeRunner(num_pages, vocab_size=VOCAB, on_batch=check),
                    fake_tokenizer(EOS), cfg)
    check.engine = eng
    pending = sorted(range(n), key=lambda i: (w["arrivals"][i], i))
    aborts = {step: str(i) for step, i in w["aborts"] if i < n}
    aborted: set[str] = set()
    out: dict[str, list[int]] = {str(i): [] for i in range(n)}
    finished: set[str] = set()
    step = 0
    while pending or eng.has_unfinished():
        while pending and w["arrivals"][pending[0]] <= step:
            i = pending[0]
            try:
                eng.add_request(prompts[i], params(max_tokens[i], i), request_id=str(i))
            except QueueFullError:
                assert len(eng.scheduler.waiting) >= cfg.max_queue
                break  # refused at once; retry next step
            pending.pop(0)
        if step in aborts and eng.abort(aborts[step]):
            aborted.add(aborts[step])
            assert aborts[step] not in eng.requests
        before = eng.runner.num_forwards
        for d in eng.step():
            out[d.request_id].extend(d.new_token_ids)
            if d.finished:
                finished.add(d.request_id)
        if eng.has_unfinished():
            # progress: every step with live requests runs one forward
            assert eng.runner.num_forwards == before + 1
        step += 1
        assert step < 3000, "the workload did not finish"
    assert eng.allocator.num_free == num_pages
    assert not eng.scheduler.running and not eng.scheduler.waiting
    assert finished | aborted == {str(i) for i in range(n)}
    ref = reference(prompts, max_tokens)
    for rid in finished:
        assert out[rid] == ref[rid], rid
    for rid in aborted:
        assert out[rid] == ref[rid][: len(out[rid])]


def test_queue_full_refuses_at_once():
    eng = LLMEngine(FakeRunner(8, vocab_size=VOCAB), None, SchedulerConfig(max_queue=2))
    eng.add_request([1, 2], SamplingParams(max_tokens=2))
    eng.add_request([1, 2], SamplingParams(max_tokens=2))
    try:
        eng.add_request([1, 2], SamplingParams(max_tokens=2))
        raise AssertionError("a full queue accepted a request")
    except QueueFullError as e:
        assert "full" in str(e)
    assert eng.stats()["waiting"] == 2
    eng.step()  # both admitted: room again
    eng.add_request([1, 2], SamplingParams(max_tokens=2))


def test_preemption_recomputes_most_recent():
    # 3 pages; two requests of 16-token prompts each need a second page to decode.
    eng = LLMEngine(FakeRunner(3, vocab_size=VOCAB), None, SchedulerConfig())
    a = eng.add_request(list(range(16)), SamplingParams(max_tokens=3, temperature=0))
    b = eng.add_request(list(range(1, 17)), SamplingParams(max_tokens=3, temperature=0))
    eng.step()  # both prefilled (1 page each), first tokens sampled
    eng.step()  # a grows to 2 pages; b needs one more: none left -> b preempted
    assert eng.scheduler.num_preemptions >= 1
    assert eng.requests[b].num_preemptions == 1 and eng.requests[a].num_preemptions == 0
    while eng.has_unfinished():
        eng.step()
    assert eng.allocator.num_free == 3


def test_abort_frees_pages_before_next_step():
    eng = LLMEngine(FakeRunner(32, vocab_size=VOCAB), None, SchedulerConfig(token_budget=20))
    long = eng.add_request(list(range(60)), SamplingParams(max_tokens=5, temperature=0))
    short = eng.add_request([1, 2, 3], SamplingParams(max_tokens=50, temperature=0))
    queued = eng.add_request([4, 5], SamplingParams(max_tokens=5, temperature=0))
    eng.step()  # budget 20: `long` is mid-prefill (20 of 60), others wait
    assert eng.requests[long].num_computed_tokens == 20 and eng.allocator.num_free == 30
    assert eng.abort(long)  # mid-prefill
    assert eng.allocator.num_free == 32 and long not in eng.requests
    assert eng.abort(queued)  # still waiting: it never held pages
    for _ in range(3):
        eng.step()
    assert eng.requests[short].num_output_tokens == 3 and eng.allocator.num_free == 31
    assert eng.abort(short)  # mid-decode
    assert eng.allocator.num_free == 32 and not eng.has_unfinished()
    assert eng.step() == [] and not eng.abort(short)


def test_slices_logits_rows_and_segment():
    """logits_rows: the prompt rows, then the sampled last row; segment() carries them."""
    eng = LLMEngine(FakeRunner(8, vocab_size=VOCAB), None)
    eng.add_request(list(range(10)), SamplingParams(max_tokens=2, prompt_logprobs=1))
    req = next(iter(eng.requests.values()))
    for prompt_rows, sample in [((), False), ((), True), ((0, 2), False), ((1, 3), True)]:
        sl = ScheduledSlice(req, 2, 4, prompt_rows, sample)
        assert sl.logits_rows == prompt_rows + ((3,) if sample else ())
    [sl] = eng.scheduler.schedule().slices  # the whole prompt, with prompt-logprob rows
    assert sl.prompt_rows == tuple(range(9)) and sl.logits_rows == tuple(range(10))
    spec = sl.segment()
    assert (spec.token_ids, spec.absolute_start, list(spec.pages)) == (
        list(range(10)), 0, req.page_table.pages)
    plain = LLMEngine(FakeRunner(8, vocab_size=VOCAB), None)
    plain.add_request(list(range(10)), SamplingParams(max_tokens=2))
    [sl] = plain.scheduler.schedule().slices
    assert sl.prompt_rows == () and sl.logits_rows == (9,) and sl.sample


def test_scheduler_layer_never_touches_arrays():
    # Policy code (scheduler, request state, pages) must not import numpy or the model side.
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "crucible" / "engine"
    for name in ("scheduler.py", "request.py", "pages.py"):
        tree = ast.parse((root / name).read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        bad = {m for m in mods if m.split(".")[0] in ("numpy", "cupy")
               or m.startswith(("crucible.model", "crucible.backend", "crucible.server"))}
        assert not bad, f"{name} imports {bad}"
