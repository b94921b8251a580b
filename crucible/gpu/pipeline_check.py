"""Part of ``gpu-graph-check``: the pipelined engine generates what the plain engine does.

Two LLMEngines on one model, one runner with pipelining (CRUCIBLE_PIPELINE's default: decode
step t+1 queued before step t's ids are read, its input ids fed on the device) and one with
it off, run the same requests: greedy and random sampling, stop ids that end requests early
(their queued rows are dropped), penalties (never pipelined), logprobs, requests aborted and
added mid-run. Every request's ids, logprobs, text and finish reason must be identical, all
pages must come back, and on the GPU the pipeline must actually have run.
"""

from __future__ import annotations

import numpy as np

from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.model.runner import ModelRunner


def _params(i: int, stop: tuple[int, ...]) -> SamplingParams:
    kinds = [dict(temperature=0.0), dict(temperature=0.9, top_k=40),
             dict(temperature=1.0, top_p=0.9, logprobs=2),
             dict(temperature=0.8, stop_token_ids=stop),
             dict(temperature=1.1, repetition_penalty=1.2), dict(temperature=0.0, logprobs=0)]
    return SamplingParams(max_tokens=4 + (5 * i) % 29, seed=i, ignore_eos=i % 2 == 0,
                          **kinds[i % len(kinds)])


def _run(runner: ModelRunner, tokenizer: object, prompts: list[list[int]],
         stop: tuple[int, ...]) -> tuple[dict[str, tuple], LLMEngine]:
    eng = LLMEngine(runner, tokenizer)
    out: dict[str, list] = {}
    n0 = len(prompts) * 2 // 3
    for i in range(n0):
        out[eng.add_request(prompts[i], _params(i, stop))] = []
    step = 0
    while eng.has_unfinished() or step < 6:
        for d in eng.step():
            out[d.request_id].append(d)
        step += 1
        if step == 3:
            eng.abort("req-1")
        if step == 5:  # late arrivals join a pipelined decode
            for i in range(n0, len(prompts)):
                out[eng.add_request(prompts[i], _params(i, stop))] = []
    flat = {rid: (tuple(t for d in ds for t in d.new_token_ids),
                  tuple(x for d in ds if d.new_logprobs for x in d.new_logprobs),
                  "".join(d.new_text for d in ds),
                  tuple(d.finish_reason for d in ds if d.finished)) for rid, ds in out.items()}
    return flat, eng


def check_pipeline(model: object, device: str, seed: int, requests: int = 24
                   ) -> tuple[int, int, int]:
    """(requests identical, requests different, steps pipelined)."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    prompts = [rng.integers(0, vocab, int(rng.integers(1, 60))).tolist()
               for _ in range(requests)]
    stop = tuple(int(t) for t in rng.choice(vocab, max(1, vocab // 8), replace=False))
    piped = ModelRunner(model, num_pages=requests * 8 + 8, device=device)
    plain = ModelRunner(model, num_pages=requests * 8 + 8, device=device)
    plain.pipeline = False
    got, eng = _run(piped, model.tokenizer, prompts, stop)
    want, _ = _run(plain, model.tokenizer, prompts, stop)
    bad = [rid for rid, w in want.items() if got.get(rid) != w]
    for rid in bad[:3]:
        print(f"  {rid}: pipelined {got.get(rid)} != plain {want[rid]}")
    same = len(want) - len(bad)
    diff = len(bad) + (set(got) != set(want))
    if eng.allocator.num_free != piped.num_pages:
        print(f"  pages: {eng.allocator.num_free} free of {piped.num_pages} at the end")
        diff += 1  # a page was lost
    return same, diff, eng.num_chained
