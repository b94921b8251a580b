"""Two load generators' requests, as they send them by default, against a tiny-model server;
each test asserts on what that client reads back, so a change that breaks it fails here.

Sources read (stored public copies, 2026-08; re-check them when a client changes):
- ai-dynamo/aiperf: src/aiperf/endpoints/{openai_chat,openai_completions,base_endpoint}.py
  (payloads, what the parsers read); src/aiperf/transports/{base_transports,
  aiohttp_transport}.py (headers), aiohttp_client.py (SSE only for the mimetype
  text/event-stream), sse_utils.py (framing, "error" payloads, the chat stream check);
  src/aiperf/common/models/{usage_models,model_autodetect}.py (usage fields, GET /v1/models
  without --model); src/aiperf/server_metrics/{endpoint_resolver,data_collector}.py
  (GET <url>/metrics by default, prometheus_client's text parser).
- kubernetes-sigs/inference-perf (7de5ef2): inference_perf/client/modelserver/
  {openai_client,vllm_client}.py (GET /v1/models without a model name, success only on
  200); inference_perf/apis/{completion,chat,streaming_parser}.py (payloads, SSE parsing,
  usage merged from any chunk); inference_perf/config/apis/config.py and config/client/
  modelserver/config.py (defaults: completions, not streamed, ignore_eos on);
  inference_perf/datagen/synthetic/random_datagen.py (add_special_tokens false with
  use_chat_template). Its tokenizer comes from the hub and its server metrics from a
  Prometheus server, so neither touches this server.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import NamedTuple

import aiohttp
import pytest

from crucible.engine.factory import TINY_MODEL, build_engine
from crucible.engine.settings import Settings
from crucible.server.launch import ServerThread
from crucible.server.probe import wait_idle
from crucible.server.state import ServerConfig

TINY = (TINY_MODEL, Settings(device="cpu", weights="f32", num_pages=256))
MODEL = "tiny"
PROMPT = "Write a short line about rivers."
OSL = 8  # output tokens asked for
CHAT = [{"role": "user", "content": PROMPT}]
INFERENCE_PERF_HEADERS = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    with ServerThread(lambda: build_engine(*TINY), ServerConfig(model_name=MODEL)) as srv:
        yield srv


@pytest.fixture
def srv(server):
    yield server
    assert wait_idle(server.state.engine_loop.engine), "pages did not come back"


class Reply(NamedTuple):
    status: int
    mimetype: str  # without parameters, as aiohttp's content_type gives it
    raw: bytes


def send(url: str, body: dict | None = None, headers: dict | None = None) -> Reply:
    """One request through aiohttp, the body read with iter_any, as both clients do."""
    async def go() -> Reply:
        async with aiohttp.ClientSession() as s:
            async with s.request("POST" if body is not None else "GET", url, headers=headers,
                                 data=None if body is None else json.dumps(body)) as r:
                raw = b"".join([c async for c in r.content.iter_any()])
                return Reply(r.status, r.content_type, raw)
    return asyncio.run(go())


def aiperf_headers(stream: bool) -> dict:
    return {"User-Agent": "aiperf/0.0.0", "X-Request-ID": str(uuid.uuid4()),
            "X-Correlation-ID": str(uuid.uuid4()), "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json"}


def sse_payloads(reply: Reply) -> list[str]:
    """The data payloads, framed as both clients split them: messages end at a blank line,
    each one line "data: <payload>" (inference-perf strips exactly "data: ")."""
    assert reply.status == 200 and reply.mimetype == "text/event-stream", reply
    text = reply.raw.decode()
    assert "\r" not in text and text.endswith("\n\n"), text[-200:]
    messages = text[:-2].split("\n\n")
    assert all(m.startswith("data: ") and "\n" not in m for m in messages), messages
    return [m.removeprefix("data: ") for m in messages]


def stream_chunks(payloads: list[str], obj: str) -> list[dict]:
    """What aiperf's stream checks need: [DONE] once and last, every other payload a JSON
    object of the given type without an "error", with a list of choices whose
    finish_reason is null or a non-empty string, and every choice finished."""
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1, payloads[-3:]
    chunks = [json.loads(p) for p in payloads[:-1]]
    for c in chunks:
        assert c["object"] == obj and not c.get("error") and isinstance(c["choices"], list), c
        assert all(ch["finish_reason"] is None or (isinstance(ch["finish_reason"], str)
                                                   and ch["finish_reason"]) for ch in c["choices"])
    seen = {ch["index"] for c in chunks for ch in c["choices"]}
    assert seen == {ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"]}
    assert seen == {0}, seen
    return chunks


def count(server, **body) -> int:
    reply = send(server.url + "/tokenize", body)
    assert reply.status == 200
    return json.loads(reply.raw)["count"]


def check_usage(usage: dict, prompt_tokens: int, reason: str, exact: bool = False) -> None:
    """The fields both read (aiperf's Usage, inference-perf's prompt count): prompt tokens as
    the server tokenised them, completion tokens consistent with the finish reason."""
    assert usage["prompt_tokens"] == prompt_tokens, usage
    done = usage["completion_tokens"]
    assert usage["total_tokens"] == prompt_tokens + done and reason in ("length", "stop")
    assert done == OSL if reason == "length" else 1 <= done <= OSL
    if exact:  # ignore_eos asked for: exactly the length requested
        assert (reason, done) == ("length", OSL)


# -- both: the model name from GET /v1/models when none is configured -----------------------

def test_model_autodetect_reads_the_first_id(srv) -> None:
    reply = send(srv.url + "/v1/models")
    assert reply.status == 200 and reply.mimetype == "application/json"
    data = json.loads(reply.raw)["data"]
    assert isinstance(data, list) and isinstance(data[0]["id"], str) and data[0]["id"] == MODEL
    # ... and that id is what the next requests carry as "model"
    body = {"model": data[0]["id"], "prompt": PROMPT, "max_tokens": 1}
    assert send(srv.url + "/v1/completions", body, INFERENCE_PERF_HEADERS).status == 200


# -- aiperf --------------------------------------------------------------------------------

def test_aiperf_chat_default_not_streamed(srv) -> None:
    """Its defaults: the chat endpoint, not streamed, max_completion_tokens (not the legacy
    max_tokens), the prompt as plain string content."""
    body = {"messages": CHAT, "model": MODEL, "stream": False, "max_completion_tokens": OSL}
    reply = send(srv.url + "/v1/chat/completions", body, aiperf_headers(False))
    assert reply.status == 200 and reply.mimetype == "application/json", reply
    out = json.loads(reply.raw)
    assert out["object"] == "chat.completion"  # anything else parses as no output
    assert isinstance((choice := out["choices"][0])["message"]["content"], str)
    check_usage(out["usage"], count(srv, messages=CHAT), choice["finish_reason"])


def test_aiperf_chat_streamed(srv) -> None:
    """--streaming: stream_options.include_usage always rides along on chat. TTFT is the
    first chunk whose delta has non-empty content; the role delta and the finish chunk
    carry none; usage comes on a last chunk with no choices."""
    body = {"messages": CHAT, "model": MODEL, "stream": True, "max_completion_tokens": OSL,
            "stream_options": {"include_usage": True}}
    reply = send(srv.url + "/v1/chat/completions", body, aiperf_headers(True))
    chunks = stream_chunks(sse_payloads(reply), "chat.completion.chunk")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[-1] == {}
    texts = [d["content"] for d in deltas if d.get("content")]
    assert all(isinstance(t, str) for t in texts)
    reason = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    if reason == "length":
        assert texts, "no chunk carried text: the client sees no first token"
    assert chunks[-1]["choices"] == [] and all(c.get("usage") is None for c in chunks[:-1])
    check_usage(chunks[-1]["usage"], count(srv, messages=CHAT), reason)


@pytest.mark.parametrize("stream, server_counts", [(False, False), (True, False), (True, True)])
def test_aiperf_completions(srv, stream: bool, server_counts: bool) -> None:
    """The completions endpoint: the prompt as a list of strings, max_tokens; include_usage
    only with --use-server-token-count. It reads choices[0].text of "text_completion"."""
    body = {"prompt": [PROMPT], "model": MODEL, "stream": stream, "max_tokens": OSL,
            **({"stream_options": {"include_usage": True}} if server_counts else {})}
    reply = send(srv.url + "/v1/completions", body, aiperf_headers(stream))
    prompt_tokens = count(srv, prompt=PROMPT)
    if not stream:
        assert reply.status == 200 and reply.mimetype == "application/json", reply
        out = json.loads(reply.raw)
        assert out["object"] == "text_completion" and isinstance(out["choices"][0]["text"], str)
        check_usage(out["usage"], prompt_tokens, out["choices"][0]["finish_reason"])
        return
    chunks = stream_chunks(sse_payloads(reply), "text_completion")
    with_text = [c for c in chunks if c["choices"]]
    assert all(isinstance(c["choices"][0]["text"], str) for c in with_text)
    reason = with_text[-1]["choices"][0]["finish_reason"]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    if server_counts:
        assert len(usage) == 1 and chunks[-1]["choices"] == []
        check_usage(usage[0], prompt_tokens, reason)
    else:
        assert usage == [] and reason in ("length", "stop")


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"'
                    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? (\S+)$')


def test_aiperf_scrapes_metrics_as_prometheus_text(srv) -> None:
    """aiperf scrapes <url>/metrics unless --no-server-metrics, with the classic text parser
    (the OpenMetrics one only for that content type): every sample under a # TYPE line,
    a float value, histograms with a +Inf bucket equal to their _count."""
    reply = send(srv.url + "/metrics")
    assert reply.status == 200 and reply.mimetype == "text/plain", reply
    types: dict[str, str] = {}
    inf_bucket: dict[str, float] = {}
    for line in reply.raw.decode().splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m and float(m[3]) is not None, line
            name, family = m[1], re.sub(r"_(bucket|sum|count)$", "", m[1])
            assert name in types or types.get(family) == "histogram", line
            if name.endswith("_bucket") and 'le="+Inf"' in (m[2] or ""):
                inf_bucket[family] = float(m[3])
            elif name.endswith("_count") and family in inf_bucket:
                assert float(m[3]) == inf_bucket[family], line
    assert "histogram" in types.values() and inf_bucket


# -- inference-perf -----------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_inference_perf_completions(srv, stream: bool) -> None:
    """Its default API (completions, not streamed unless api.streaming): the prompt as a
    string, max_tokens, ignore_eos true; include_usage when streamed. usage.prompt_tokens
    is taken as the input length; text from choices[0].text."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": OSL, "ignore_eos": True,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    reply = send(srv.url + "/v1/completions", body, INFERENCE_PERF_HEADERS)
    assert reply.status == 200, reply  # exactly 200: anything else is counted a failure
    usage, texts = inference_perf_read(reply, lambda c: c["choices"][0]["text"])
    assert texts and all(isinstance(t, str) for t in texts)
    check_usage(usage, count(srv, prompt=PROMPT), "length", exact=True)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("content", [PROMPT, [{"type": "text", "text": PROMPT}]],
                         ids=["string", "text-parts"])  # parts: its shared-prefix datagen
def test_inference_perf_chat(srv, stream: bool, content: object) -> None:
    msgs = [{"role": "user", "content": content}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": OSL, "ignore_eos": True,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    reply = send(srv.url + "/v1/chat/completions", body, INFERENCE_PERF_HEADERS)
    assert reply.status == 200, reply
    key = "delta" if stream else "message"
    usage, texts = inference_perf_read(reply, lambda c: c["choices"][0][key].get("content"))
    assert texts and all(isinstance(t, str) for t in texts)  # "".join() of them
    check_usage(usage, count(srv, messages=CHAT), "length", exact=True)


def inference_perf_read(reply: Reply, extract) -> tuple[dict, list[str]]:
    """Usage and text pieces as inference-perf reads them: a JSON body through aiohttp's
    json() (which insists on application/json), or the SSE stream up to [DONE], usage
    merged from any chunk carrying a usage object, text from chunks with choices."""
    if reply.mimetype != "text/event-stream":
        assert reply.mimetype == "application/json", reply
        out = json.loads(reply.raw)
        return out["usage"], [extract(out)]
    usage: dict = {}
    texts: list[str] = []
    assert (payloads := sse_payloads(reply))[-1] == "[DONE]", payloads[-3:]
    for p in payloads[:-1]:
        chunk = json.loads(p)
        if isinstance(chunk.get("usage"), dict):
            assert chunk["choices"] == [], chunk  # the trailing usage-only chunk
            usage.update(chunk["usage"])
        elif (text := extract(chunk)):
            texts.append(text)
    return usage, texts


def test_inference_perf_templated_prompt_without_special_tokens() -> None:
    """With data.use_chat_template its random datagen sends prompts already templated and
    add_special_tokens false, so the server must not add a BOS of its own (vLLM's field).
    The tiny model adds none, so this server's tokenizer is told to; the prompt is plain
    text because the tiny template starts with its BOS already (never doubled)."""
    def engine():
        built = build_engine(*TINY)
        built[0].tokenizer.add_bos = True
        return built

    with ServerThread(engine, ServerConfig(model_name=MODEL)) as bos:
        bare = len(bos.state.engine_loop.engine.tokenizer.encode(PROMPT, add_bos=False))
        url, body = bos.url + "/v1/completions", {"model": MODEL, "prompt": PROMPT,
                                                   "max_tokens": 2, "ignore_eos": True}
        assert json.loads(send(url, body).raw)["usage"]["prompt_tokens"] == bare + 1
        reply = send(url, {**body, "add_special_tokens": False}, INFERENCE_PERF_HEADERS)
        assert reply.status == 200, reply
        assert json.loads(reply.raw)["usage"]["prompt_tokens"] == bare == \
            count(bos, prompt=PROMPT, add_special_tokens=False)
        bad = send(url, {**body, "add_special_tokens": "no"})  # still a 400 naming it
        assert bad.status == 400
        assert json.loads(bad.raw)["error"]["param"] == "add_special_tokens"
        assert wait_idle(bos.state.engine_loop.engine)
