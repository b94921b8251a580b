"""Part of ``gpu-graph-check``: the pipelined engine generates what the plain engine does.

Two LLMEngines on one model, one runner with pipelining (CRUCIBLE_PIPELINE's default: decode
step t+1 queued before step t's ids are read, its input ids fed on the device) and one with
it off, run the same requests: greedy and random sampling, stop ids that end requests early
(their queued rows are dropped), penalties (never pipelined), logprobs, requests aborted and
added mid-run. Every request's ids, logprobs, text and finish reason must be identical, all
pages must come back, and on the GPU the pipeline must actually have run.

``mixed`` ("graphs" or "eager"): the late arrivals come one a step and make mixed steps,
which are planned ahead too (engine/pipeline_next.py), their decode rows reading step t's
ids on the device. With "graphs" the candidate's mixed graphs capture every shape at its
first sighting, so fed steps replay them; with "eager" it has none, so they run eagerly.
Some mixed step must have been fed, and with "graphs" some mixed graph replayed.
"""

from __future__ import annotations

import numpy as np

from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.runner import ModelRunner


def _params(i: int, stop: tuple[int, ...], greedy: bool = False,
            mixed: str | None = None) -> SamplingParams:
    if greedy:  # plain greedy rows, some with stop ids: a decode graph's argmax serves them
        kind = dict(stop_token_ids=stop) if i % 3 == 1 else {}
        return SamplingParams(max_tokens=4 + (5 * i) % 29, seed=i, ignore_eos=i % 2 == 0,
                              temperature=0.0, **kind)
    kinds = [dict(temperature=0.0), dict(temperature=0.9, top_k=40),
             dict(temperature=1.0, top_p=0.9, logprobs=2),
             dict(temperature=0.8, stop_token_ids=stop),
             dict(temperature=1.1, repetition_penalty=1.2), dict(temperature=0.0, logprobs=0)]
    if mixed:  # a penalty row reads step t's token: while one runs, nothing is planned ahead
        kinds[4] = dict(temperature=1.1, min_p=0.05)
    return SamplingParams(max_tokens=4 + (5 * i) % 29, seed=i, ignore_eos=i % 2 == 0,
                          **kinds[i % len(kinds)])


def _run(runner: ModelRunner, tokenizer: object, prompts: list[list[int]],
         stop: tuple[int, ...], greedy: bool = False, mixed: str | None = None
         ) -> tuple[dict[str, tuple], LLMEngine]:
    eng = LLMEngine(runner, tokenizer)
    out: dict[str, list] = {}
    n0 = len(prompts) * 2 // 3
    for i in range(n0):
        out[eng.add_request(prompts[i], _params(i, stop, greedy, mixed))] = []
    step = 0
    while eng.has_unfinished() or step < 6:
        for d in eng.step():
            out[d.request_id].append(d)
        step += 1
        if step == 3:
            eng.abort("req-1")
        late = range(n0, len(prompts))
        if mixed:  # one a step from step 2: many mixed steps
            late = [n0 + step - 2] if 0 <= step - 2 < len(prompts) - n0 else []
        elif step != 5:  # all at once: they join a pipelined decode
            late = []
        for i in late:
            out[eng.add_request(prompts[i], _params(i, stop, greedy, mixed))] = []
    flat = {rid: (tuple(t for d in ds for t in d.new_token_ids),
                  tuple(x for d in ds if d.new_logprobs for x in d.new_logprobs),
                  "".join(d.new_text for d in ds),
                  tuple(d.finish_reason for d in ds if d.finished)) for rid, ds in out.items()}
    return flat, eng


def check_pipeline(model: object, device: str, seed: int, requests: int = 24,
                   greedy: bool = False, mixed: str | None = None) -> tuple[int, int, int]:
    """(requests identical, requests different, steps pipelined). ``greedy``: every request
    plain greedy, so the candidate's decode steps take their ids from the graphs' argmax;
    the reference then runs without graphs (every id from the sampler's kernel), and on the
    GPU some step must have used the argmax."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    prompts = [rng.integers(0, vocab, int(rng.integers(1, 60))).tolist()
               for _ in range(requests)]
    stop = tuple(int(t) for t in rng.choice(vocab, max(1, vocab // 8), replace=False))
    piped = ModelRunner(model, num_pages=requests * 8 + 8, device=device)
    plain = ModelRunner(model, num_pages=requests * 8 + 8, device=device)
    plain.pipeline = False
    if greedy and getattr(plain.backend, "graphs", None) is not None:
        plain.backend.graphs = plain.backend.prefill_graphs = plain.backend.mixed_graphs = None
    graphs = getattr(piped.backend, "graphs", None) is not None
    mg = getattr(piped.backend, "mixed_graphs", None)
    if mixed == "eager" or mg is None:
        piped.backend.mixed_graphs = mg = None
    elif mixed == "graphs":
        mg.capture_after = 1
    got, eng = _run(piped, model.tokenizer, prompts, stop, greedy, mixed)
    want, _ = _run(plain, model.tokenizer, prompts, stop, greedy, mixed)
    bad = [rid for rid, w in want.items() if got.get(rid) != w]
    for rid in bad[:3]:
        print(f"  {rid}: pipelined {got.get(rid)} != plain {want[rid]}")
    same = len(want) - len(bad)
    diff = len(bad) + (set(got) != set(want))
    if eng.allocator.num_free != piped.num_pages:
        print(f"  pages: {eng.allocator.num_free} free of {piped.num_pages} at the end")
        diff += 1  # a page was lost
    if greedy and getattr(piped.backend, "graphs", None) is not None:
        print(f"  {piped.num_argmax_steps} steps took their ids from a decode graph's argmax")
        diff += piped.num_argmax_steps == 0
    if mixed and graphs:
        print(f"  {eng.num_chained_mixed} mixed steps queued before the previous step's ids"
              + (f", {mg.num_replays} mixed graph replays" if mg is not None else ""))
        diff += eng.num_chained_mixed == 0 or (mixed == "graphs" and not mg.num_replays)
        # New graph keys come all through such a run: planned steps that would capture wait
        # for the one in flight to be collected (LLMEngine.step, backend first_use).
        print(f"  {eng.num_deferred} planned steps were a graph's first use and waited")
        diff += mixed == "graphs" and eng.num_deferred == 0
    return same, diff, eng.num_chained
