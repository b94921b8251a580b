"""The server with the default model (SmolLM2-135M-Instruct, CPU), where text matters:
real chat text through both SDKs, chat streaming == non-streaming, stop reasons, stop
sequences, solo == concurrent. Few tokens per request: CPU decode is ~7 tokens/s."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

from crucible.engine.factory import build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import wait_idle
from crucible.server.state import ServerConfig

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(default_model):
    settings = Settings(device="cpu", weights="int8", num_pages=128)
    with ServerThread(lambda: build_engine(default_model, settings),
                      ServerConfig(model_name=MODEL)) as srv:
        srv.engine = srv.state.engine_loop.engine
        yield srv


@pytest.fixture
def oa(server):
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    assert wait_idle(server.engine)


@pytest.fixture
def an(server):
    yield anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    assert wait_idle(server.engine)


def test_chat_text_streaming_equals_non_streaming(oa):
    kw = dict(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0)
    whole = oa.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert "Paris" in text and "<|im_end|>" not in text
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in oa.chat.completions.create(**kw, stream=True) if c.choices)
    assert streamed == text
    n, reason = whole.usage.completion_tokens, whole.choices[0].finish_reason
    assert (reason == "length" and n == 10) or (reason == "stop" and n <= 10)


def test_anthropic_message_and_stop_reasons(an):
    kw = dict(model=MODEL, max_tokens=10, messages=QUESTION, extra_body={"temperature": 0})
    msg = an.messages.create(**kw)
    text = msg.content[0].text
    assert "Paris" in text
    # end_turn: the model's end-of-turn token (counted, not shown) came within the limit.
    n = msg.usage.output_tokens
    assert (msg.stop_reason, n <= 10) == ("end_turn", True) or (msg.stop_reason, n) == (
        "max_tokens", 10)
    words = text.split()
    assert len(words) >= 3
    seq = " " + words[2]
    cut = an.messages.create(**kw, stop_sequences=[seq])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == seq
    assert cut.content[0].text == text[: text.find(seq)]


def test_completion_text_and_solo_equals_concurrent(server, oa):
    prompts = ["The capital of France is", "def add(a, b):"]
    solo = [oa.completions.create(model=MODEL, prompt=p, max_tokens=4, temperature=0,
                                  ).choices[0].text for p in prompts]
    assert "Paris" in solo[0]
    aoa = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                             timeout=120)

    async def together() -> list[str]:
        rs = await asyncio.gather(*(aoa.completions.create(
            model=MODEL, prompt=p, max_tokens=4, temperature=0) for p in prompts))
        return [r.choices[0].text for r in rs]

    assert asyncio.run(together()) == solo
