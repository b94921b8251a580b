"""The engine process's wire format and the front's detokenising, without processes: frames
round-trip exactly, an engine with ``detokenize`` off sends ids only, and those ids through
the wire and ``FrontOutput`` give the very deltas (text pieces, stop strings, kept ids,
logprobs) the in-process engine builds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from crucible.engine import core_wire as wire
from crucible.engine.engine import RequestDelta
from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.sampling import SamplingParams
from crucible.engine.settings import Settings
from crucible.server.front_output import FrontOutput

SETTINGS = Settings(device="cpu", weights="f32", num_pages=256)


def test_step_frame_round_trips():
    rnd = random.Random(0)

    def lp(k):
        return {rnd.randrange(300): rnd.uniform(-20, 0) for _ in range(k)}

    deltas = [
        (7, RequestDelta("a", (5,), "", None, None, False, None, 0)),
        (8, RequestDelta("b", (1, 2, 3), "", (lp(3), lp(1), lp(21)), None, True, "length", 32)),
        (2 ** 32 - 1, RequestDelta("c", (), "", None, None, True, "abort", 0)),
        (9, RequestDelta("d", (4,), "", (lp(2),), (None, lp(2), lp(3)), True, "stop", 16)),
        (10, RequestDelta("e", (0,), "", (), (None,), False, None, 0)),
    ]
    counters = list(range(100, 100 + len(wire.STATS_KEYS)))
    got_counters, got = wire.decode_step(wire.encode_step(deltas, counters))
    assert got_counters == dict(zip(wire.STATS_KEYS, counters))
    want = [wire.WireDelta(h, d.new_token_ids, d.finish_reason, d.num_cached_tokens,
                           d.new_logprobs, d.prompt_logprobs) for h, d in deltas]
    assert got == want
    # dict order (rank order, then the sampled token) survives too
    assert [list(x) for x in got[1].logprobs] == [list(x) for x in deltas[1][1].new_logprobs]
    empty = wire.decode_step(wire.encode_step([], counters))
    assert empty == (got_counters, [])


def test_add_and_abort_frames_round_trip():
    params = SamplingParams(max_tokens=9, temperature=0.7, top_k=5, stop=("ab", "\u00e9"),
                            stop_token_ids=(3, 4), seed=11, logprobs=2, prompt_logprobs=1,
                            min_tokens=2, repetition_penalty=1.1)
    frame = wire.encode_add(42, "req-1", [1, 2, 270], params, final_only=True,
                            cache_salt="t", use_prefix_cache=False)
    handle, ids, meta = wire.decode_add(frame)
    assert (handle, ids.tolist(), meta["rid"], meta["params"]) == (42, [1, 2, 270], "req-1",
                                                                     params)
    assert ids.dtype == np.int32
    assert (meta["final_only"], meta["cache_salt"], meta["use_prefix_cache"]) == (True, "t", False)
    assert wire.decode_abort(wire.encode_abort([3, 2 ** 31])) == [3, 2 ** 31]


def test_the_tokenizer_travels_whole():
    engine, _ = build_engine(TINY_MODEL, SETTINGS)
    tok = engine.tokenizer
    again = wire.tokenizer_from_payload(wire.decode_json(wire.encode_json(
        wire.READY, wire.tokenizer_payload(tok))))
    text = "héllo <|im_end|> the ring\n\n20 \u4e2d"
    assert again.encode(text) == tok.encode(text)
    assert again.stop_token_ids == tok.stop_token_ids and again.add_bos == tok.add_bos
    assert again.apply_chat_template([{"role": "user", "content": "x"}]) == \
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert [again.token_bytes(i) for i in range(tok.vocab_size)] == \
        [tok.token_bytes(i) for i in range(tok.vocab_size)]


def drive(engine, jobs, front=None):
    """Run (rid, prompt, params) to the end; the deltas of each request in order. With
    ``front`` (rid -> FrontOutput) every step goes through the wire and the front."""
    for rid, prompt, params in jobs:
        engine.add_request(prompt, params, rid)
    handle = {rid: i for i, (rid, _, _) in enumerate(jobs)}
    out: dict[str, list] = {rid: [] for rid, _, _ in jobs}
    while engine.has_unfinished():
        deltas = engine.step()
        if front is None:
            for d in deltas:
                out[d.request_id].append(d)
            continue
        _, wired = wire.decode_step(wire.encode_step([(handle[d.request_id], d)
                                                      for d in deltas],
                                                     [0] * len(wire.STATS_KEYS)))
        for w in wired:
            rid = jobs[w.handle][0]
            d, cut = front[rid].feed(w)
            if d is not None:
                out[rid].append(d)
            if cut:
                engine.abort(rid)  # as the client does; later deltas would be dropped anyway
    return out


@pytest.fixture(scope="module")
def engines():
    ref, _ = build_engine(TINY_MODEL, SETTINGS)
    ids_only, _ = build_engine(TINY_MODEL, SETTINGS)
    ids_only.detokenize = False
    return ref, ids_only


def test_ids_only_engine_sends_no_text_and_ignores_stop_strings(engines):
    _, ids_only = engines
    params = SamplingParams(max_tokens=12, temperature=0, stop=("r",), ignore_eos=True)
    (deltas,) = drive(ids_only, [("x", [65, 66, 67], params)]).values()
    assert all(d.new_text == "" for d in deltas)
    assert sum(len(d.new_token_ids) for d in deltas) == 12
    assert deltas[-1].finish_reason == "length"


def test_front_output_gives_the_in_process_deltas(engines):
    ref, ids_only = engines
    tok = ref.tokenizer
    prompts = [tok.encode(t) for t in ("hello world", "the cat sat on", "ring ring", "x")]
    free = SamplingParams(max_tokens=40, temperature=1.0, seed=5, ignore_eos=True)
    (probe,) = drive(ref, [("probe", prompts[1], free)]).values()
    text = "".join(d.new_text for d in probe)
    ids = [t for d in probe for t in d.new_token_ids]
    mid = len(text) // 2
    jobs_params = [
        SamplingParams(max_tokens=20, temperature=0.0, logprobs=2, prompt_logprobs=1),
        SamplingParams(max_tokens=40, temperature=1.0, seed=5, ignore_eos=True,
                       stop=(text[mid : mid + 2], "\uffff\uffff")),
        SamplingParams(max_tokens=40, temperature=1.0, seed=5, ignore_eos=True,
                       stop=(text[1:3],), min_tokens=10, logprobs=1),
        SamplingParams(max_tokens=40, temperature=1.0, seed=5, stop_token_ids=(ids[7],)),
        SamplingParams(max_tokens=30, temperature=0.9, seed=9, top_p=0.8,
                       stop=(text[-2:],)),
    ]
    # r1-r3 repeat the probe (same prompt, same seed): its stop string and id must come
    jobs = [(f"r{i}", prompts[(0, 1, 1, 1, 2)[i]], p) for i, p in enumerate(jobs_params)]
    want = drive(ref, jobs)
    front = {rid: FrontOutput(rid, p, tok) for rid, _, p in jobs}
    got = drive(ids_only, jobs, front)
    assert got == want
    reasons = [want[rid][-1].finish_reason for rid, _, _ in jobs]
    assert reasons[1] == reasons[3] == "stop"  # a stop string and a stop id did end them
    assert len(want["r1"]) < 40 and len(want["r3"]) <= 8
