"""Streamed text through the pipelined decode step (engine/updates.py), on the CPU.

``ScriptRunner`` is a device-sampling runner whose draws spell a script chosen per request
(by its seed) at the row's draw counter, so the engine sees exactly the ids a case needs:
characters split across byte tokens, stop strings that span steps or split characters,
skipped special tokens, invalid bytes, stop ids. A row planned with a wrong counter draws
a wrong id and the text changes. Every case runs pipelined (the decode step's columns and
its whole-text lookups) and not (the general update per slice): the deltas must be the
same, one per token, and the text what the case says.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from crucible.engine.engine import LLMEngine
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer
from crucible.step.rows import SampleOutput

import numpy as np

TOK = tiny_tokenizer()
IM_START = 270  # a special token: skipped in the text


class _Done:
    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


class ScriptRunner:
    def __init__(self, scripts: dict[int, list[int]], chain_rows: int) -> None:
        self.scripts = scripts
        self.chain_rows = chain_rows
        self.mixed_feed_rows = 1 if chain_rows else None  # ids come from the script
        self.num_pages = 256
        self.config = SimpleNamespace(vocab_size=TINY_VOCAB_SIZE, max_context=512)
        self.sampler = object()  # not None: the engine samples "on the device"
        self.backend = SimpleNamespace(arithmetic="script")

    def first_use(self, batch, fed):
        return False

    def launch_sample(self, batch, rows, host_rows=(), feed=None):
        ids = tuple(self.scripts[r.seed][r.counter] for r in rows)
        lps = tuple(None if r.num_logprobs is None else {t: -0.5} for r, t in zip(rows, ids))
        host = np.zeros((len(host_rows), TINY_VOCAB_SIZE), np.float32)
        return _Done((SampleOutput(ids, lps), host))


def enc(text: str) -> list[int]:
    return TOK.encode(text)


# (script ids, params, final_only, expected text, expected reason)
CASES = [
    (enc("naïve café 😀 東京!"), {}, False, "naïve café 😀 東京!", "length"),
    (enc("hello world, stop here"), dict(stop=("stop",)), False, "hello world, ", "stop"),
    (enc("un café noir"), dict(stop=("fé",)), False, "un ca", "stop"),
    (enc("😀😀 done"), dict(stop=("😀 d",)), False, "😀", "stop"),
    (enc("ab") + [IM_START] + enc("cd"), {}, False, "abcd", "length"),
    ([0xFF] + enc("x") + [0xC3] + enc("y") + [0xE6, 0x97] + enc("zz, ok"), {}, False,
     "\ufffdx\ufffdy\ufffdzz, ok", "length"),  # a whole token after a cut character
    (enc("x") + [0xE6, 0x97], {}, False, "x\ufffd", "length"),  # cut inside 日
    (enc("ok! more"), dict(stop_token_ids=(ord("!"),)), False, "ok", "stop"),
    (enc("xaxaxa"), dict(stop=("a",), min_tokens=3), False, "xax", "stop"),
    (enc("kept with logprobs é"), dict(logprobs=1), False, "kept with logprobs é", "length"),
    (enc("abc stop zzz"), dict(stop=("stop",)), True, "abc ", "stop"),
    (enc("the end é"), {}, True, "", "length"),  # final_only: LLM.generate decodes the ids
]


def run(chain_rows: int, detokenize: bool = True) -> dict[int, list]:
    scripts = {seed: ids + enc(" tail")
               for seed, (ids, *_rest) in enumerate(CASES, start=1)}
    eng = LLMEngine(ScriptRunner(scripts, chain_rows), TOK, SchedulerConfig(token_budget=64))
    eng.detokenize = detokenize
    rids = {}
    for seed, (ids, kw, final_only, _, _) in enumerate(CASES, start=1):
        params = SamplingParams(temperature=0.0, seed=seed, ignore_eos=True,
                                max_tokens=len(ids), **kw)
        rids[eng.add_request(enc("prompt"), params, final_only=final_only)] = seed
    out: dict[int, list] = {seed: [] for seed in rids.values()}
    while eng.has_unfinished():
        for d in eng.step():
            out[rids[d.request_id]].append(dataclasses.astuple(d)[1:])
    assert eng.allocator.num_free == eng.allocator.num_pages
    if chain_rows:
        assert eng.num_chained > 0, "the pipelined decode step never ran"
    return out


def check(out: dict[int, list]) -> None:
    """Each case's deltas give its text and reason, one delta per token when streamed."""
    for seed, (ids, _kw, final_only, text, reason) in enumerate(CASES, start=1):
        deltas = out[seed]
        assert "".join(d[1] for d in deltas) == text, seed
        assert deltas[-1][4] is True and deltas[-1][5] == reason, seed
        got = [t for d in deltas for t in d[0]]
        assert got == ids[: len(got)] and (reason == "stop" or len(got) == len(ids)), seed
        if not final_only:  # one delta per token, and no piece of a character shown
            assert all(len(d[0]) == 1 for d in deltas), seed
            assert all("\ufffd" not in d[1] for d in deltas) or "\ufffd" in text, seed


def test_pipelined_text_equals_the_general_path_and_the_script() -> None:
    # The general path first: it meets every id, so the pipelined run finds their whole
    # texts kept and takes its fast path wherever nothing is pending.
    plain = run(chain_rows=0)
    piped = run(chain_rows=64)
    assert piped == plain
    check(piped)
    # The emoji shows whole, in the delta of its fourth byte.
    first = piped[1]
    at = next(i for i, d in enumerate(first) if "😀" in d[1])
    assert [d[0][0] for d in first[at - 3 : at + 1]] == list("😀".encode())
    assert [d[1] for d in first[at - 3 : at]] == ["", "", ""]


def test_ids_only_engine_keeps_no_text() -> None:
    """The engine process (``detokenize`` off): the same ids, no text, no stop strings."""
    got = run(chain_rows=64, detokenize=False)
    assert got == run(chain_rows=0, detokenize=False)
    assert all(d[1] == "" for ds in got.values() for d in ds)
    # Stop strings are the front's job there: the request runs to its length.
    assert got[2][-1][5] == "length" and len(got[2]) == len(CASES[1][0])


@pytest.mark.parametrize("chain_rows", [0, 64])
def test_a_second_stream_of_the_same_ids_is_the_same(chain_rows: int) -> None:
    """The whole texts kept from the first run (shared by the tokenizer's detokenizers)
    give the second run exactly the same deltas."""
    first = run(chain_rows)
    assert run(chain_rows) == first
    check(first)
