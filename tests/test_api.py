"""The embedded API (LLM.generate / chat / stats), stop handling, and async streaming."""

from __future__ import annotations

import asyncio

import pytest

from crucible import LLM, SamplingParams
from crucible.errors import ConfigError, QueueFullError, RequestError
from crucible.model.tiny import tiny_random_model

PROMPTS = ["hello world", "the quick brown fox", "a", "jumps over the lazy dog " * 3]


@pytest.fixture(scope="module")
def llm():
    return LLM(tiny_random_model(0, weights="f32", tie_embeddings=False), weights="f32",
               token_budget=64)


def greedy(n=12, **kw):
    return SamplingParams(temperature=0, max_tokens=n, **kw)


def test_generate_outputs(llm):
    outs = llm.generate(PROMPTS, greedy(12, logprobs=2, prompt_logprobs=1))
    assert [o.prompt for o in outs] == PROMPTS
    for o, p in zip(outs, PROMPTS):
        assert o.prompt_token_ids == tuple(llm.tokenizer.encode(p))
        assert 1 <= len(o.token_ids) <= 12 and o.finish_reason in ("stop", "length")
        body = [t for t in o.token_ids if t not in llm.tokenizer.stop_token_ids]
        assert o.text == llm.tokenizer.decode(body, skip_special_tokens=True)
        assert len(o.logprobs) == len(o.token_ids)
        assert all(t in lp for t, lp in zip(o.token_ids, o.logprobs))
        assert len(o.prompt_logprobs) == len(o.prompt_token_ids) and o.prompt_logprobs[0] is None
    s = llm.stats()
    assert s["pages_free"] == s["pages_total"] and s["running"] == s["waiting"] == 0
    assert s["steps"] > 0 and s["preemptions"] == 0


def test_packed_equals_one_at_a_time_and_token_prompts(llm):
    together = llm.generate(PROMPTS, greedy())
    alone = [llm.generate(p, greedy())[0] for p in PROMPTS]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    ids = llm.tokenizer.encode(PROMPTS[1])
    by_ids = llm.generate(ids, greedy())[0]
    assert by_ids.prompt is None and by_ids.token_ids == together[1].token_ids


def test_unseeded_requests_are_reproducible_across_fresh_llms():
    def fresh():
        return LLM(tiny_random_model(0, weights="f32", tie_embeddings=False), weights="f32")
    p = SamplingParams(max_tokens=8, temperature=1.0)
    a = [o.token_ids for o in fresh().generate(PROMPTS, p)]
    b = [o.token_ids for o in fresh().generate(PROMPTS, p)]
    assert a == b and len(set(a)) == len(a)  # derived seeds differ per request


def test_stop_string_and_stop_token(llm):
    base = llm.generate(PROMPTS[0], greedy(16, ignore_eos=True))[0]
    assert len(base.text) >= 6
    stop = base.text[3:5]
    cut = llm.generate(PROMPTS[0], greedy(16, ignore_eos=True, stop=[stop, "\x00never"]))[0]
    assert cut.finish_reason == "stop" and cut.text == base.text[: base.text.index(stop)]
    assert stop not in cut.text
    tok = base.token_ids[4]
    first = base.token_ids.index(tok)
    st = llm.generate(PROMPTS[0], greedy(16, ignore_eos=True, stop_token_ids=[tok]))[0]
    assert st.finish_reason == "stop" and st.token_ids == base.token_ids[: first + 1]
    # min_tokens masks the stop token until enough tokens exist
    late = llm.generate(PROMPTS[0], greedy(16, ignore_eos=True, stop_token_ids=[tok],
                                           min_tokens=first + 2))[0]
    assert tok not in late.token_ids[: first + 2]


def test_more_prompts_than_the_queue():
    small = LLM(tiny_random_model(0, weights="f32", tie_embeddings=False), weights="f32",
                max_queue=2, max_running=2)
    outs = small.generate(PROMPTS * 2, greedy(4))
    assert len(outs) == 8 and small.stats()["pages_free"] == small.stats()["pages_total"]
    assert [o.token_ids for o in outs[:4]] == [o.token_ids for o in outs[4:]]


def test_chat(llm):
    msgs = [{"role": "user", "content": "hi"}]
    out = llm.chat(msgs, greedy(5))[0]
    assert out.prompt == llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    assert len(llm.chat([msgs, msgs], greedy(5))) == 2


def test_bad_input(llm):
    with pytest.raises(RequestError, match="context"):
        llm.generate([[1] * 600], greedy())
    with pytest.raises(ConfigError):
        llm.generate(PROMPTS, [greedy()])
    with pytest.raises(ConfigError):
        LLM(tiny_random_model(0), weights="int8")  # the tiny model was loaded as f32
    assert llm.stats()["waiting"] == 0


def test_async_streaming_abort_and_queue(llm):
    ae = llm.async_engine()
    tok = llm.tokenizer

    async def collect(prompt, params):
        deltas = [d async for d in ae.generate(tok.encode(prompt), params)]
        return deltas

    offline = llm.generate(PROMPTS, greedy(10))  # before the worker owns the engine

    async def main():
        res = await asyncio.gather(*(collect(p, greedy(10)) for p in PROMPTS))
        for deltas, off in zip(res, offline):
            assert deltas[-1].finished and all(not d.finished for d in deltas[:-1])
            assert tuple(t for d in deltas for t in d.new_token_ids) == off.token_ids
            assert "".join(d.new_text for d in deltas) == off.text
        # abort mid-decode: the stream ends with "abort" and every page comes back
        it = ae.generate(tok.encode(PROMPTS[3]), SamplingParams(max_tokens=400, ignore_eos=True))
        first = await it.__anext__()
        assert not first.finished
        rid = first.request_id
        ae.abort(rid)
        rest = [d async for d in it]
        assert rest[-1].finish_reason == "abort"
        # leaving an iterator early aborts its request too
        it2 = ae.generate(tok.encode(PROMPTS[0]), SamplingParams(max_tokens=400, ignore_eos=True))
        await it2.__anext__()
        await it2.aclose()
        for _ in range(200):
            if not llm.engine.has_unfinished():
                break
            await asyncio.sleep(0.01)
        s = ae.stats()
        assert s["pages_free"] == s["pages_total"] and s["running"] == 0
        await ae.shutdown()

    asyncio.run(main())


def test_async_queue_full_refuses_at_once():
    small = LLM(tiny_random_model(0, weights="f32"), weights="f32", max_queue=2, max_running=1)
    ae = small.async_engine()
    long = SamplingParams(max_tokens=300, ignore_eos=True)

    async def main():
        accepted = 0
        with pytest.raises(QueueFullError):
            for _ in range(4):  # one may be admitted (running) at once; two more wait
                ae.add([1, 2, 3], long)
                accepted += 1
        assert accepted in (2, 3)
        with pytest.raises(RequestError):
            ae.add([], greedy(2))
        with pytest.raises(QueueFullError):  # generate() refuses when called, not later
            ae.generate([1, 2, 3], long)
        await ae.shutdown()
        s = ae.stats()
        assert s["pages_free"] == s["pages_total"] and s["running"] == s["waiting"] == 0

    asyncio.run(main())


@pytest.mark.model
def test_default_model_packed_equals_one_at_a_time():
    llm = LLM()
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Write a haiku about the sea.",
               "def fibonacci(n):", "Hello", "The opposite of hot is",
               "List three colors:", "Once upon a time"]
    p = SamplingParams(temperature=0, max_tokens=6)
    together = llm.generate(prompts, p)
    alone = [llm.generate([pr], p)[0] for pr in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.text for o in together] == [o.text for o in alone]
    assert "Paris" in together[0].text
    assert llm.stats()["pages_free"] == llm.stats()["pages_total"]


def test_async_stream_with_stop_string_matches_offline(llm):
    base = llm.generate(PROMPTS[1], greedy(20, ignore_eos=True))[0]
    stop = base.text[6:9]
    params = greedy(20, ignore_eos=True, stop=[stop])
    offline = llm.generate(PROMPTS[1], params)[0]
    ae = llm.async_engine()

    async def main():
        deltas = [d async for d in ae.generate(llm.tokenizer.encode(PROMPTS[1]), params)]
        await ae.shutdown()
        return deltas

    deltas = asyncio.run(main())
    assert offline.finish_reason == "stop" and stop not in offline.text
    # no delta ever showed text past the stop string, even part of it
    assert "".join(d.new_text for d in deltas) == offline.text == base.text[: base.text.index(stop)]
    assert deltas[-1].finish_reason == "stop"


def test_generate_text_equals_the_streamed_text(llm):
    """LLM.generate decodes each output once at the end; the async engine streams it. The
    two texts are the same, for a length end, a stop id (its text never shown) and a stop
    string (streamed, since it needs the text)."""
    import asyncio

    base = llm.generate(PROMPTS[1], greedy(24, ignore_eos=True))[0]
    cases = [greedy(24, ignore_eos=True), greedy(24, ignore_eos=True,
                                                  stop_token_ids=[base.token_ids[6]]),
             greedy(24, ignore_eos=True, stop=[base.text[4:6] or "x"])]
    outs = llm.generate([PROMPTS[1]] * 3, cases)

    eng = llm.async_engine()  # one: two async engines would both step the same engine

    async def stream(params):
        ids = llm.tokenizer.encode(PROMPTS[1])
        return "".join([d.new_text async for d in eng.generate(ids, params)])

    for out, params in zip(outs, cases):
        assert out.text == asyncio.run(stream(params))
    assert outs[1].finish_reason == "stop" and outs[2].finish_reason == "stop"
    assert len(outs[1].text) < len(outs[0].text)


def test_one_async_engine_that_restarts_after_shutdown(llm):
    """One streaming front per LLM (two would step one engine from two threads), and a
    request after ``shutdown`` starts its worker again."""
    import asyncio

    ae = llm.async_engine()
    assert llm.async_engine() is ae
    ids = llm.tokenizer.encode(PROMPTS[0])

    async def once():
        out = [d async for d in ae.generate(ids, greedy(4))]
        await ae.shutdown()
        return out

    first, second = asyncio.run(once()), asyncio.run(once())
    assert [d.new_token_ids for d in first] == [d.new_token_ids for d in second]
    assert first[-1].finished and second[-1].finished
