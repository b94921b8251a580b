"""OpenAI ``POST /v1/chat/completions``: messages through the model's own chat template.

Streams follow OpenAI's order per choice: a role delta first, content deltas, a final chunk
with ``finish_reason``; then a usage chunk when ``stream_options.include_usage`` is set, and
``data: [DONE]`` last. Without max_tokens a chat may use the rest of the context, as in
OpenAI's API; generation normally ends at the template's end-of-turn token.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from crucible.engine.engine import RequestDelta
from crucible.server import sse
from crucible.server.errors import bad_request, error_body, from_exception
from crucible.server.fields import Body, read_json
from crucible.server.openai_common import (IGNORED_FIELDS, chat_logprobs, finish_reason,
                                           new_id, now, read_model, usage)
from crucible.server.params import (MAX_N, SAMPLING_FIELDS, cache_salt, choice_params,
                                    max_tokens_field, sampling_params)
from crucible.server.state import REQUEST_ID, STATE, ServerState
from crucible.server.stream import EngineFailure

routes = web.RouteTableDef()
_FIELDS = ("messages", "max_tokens", "max_completion_tokens", "n", "stream", "logprobs",
           "top_logprobs", "logit_bias", "response_format", "tools", "tool_choice",
           *SAMPLING_FIELDS, *IGNORED_FIELDS)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _text_content(content: Any, where: str) -> str:
    """A message's content: a string or a list of text parts (other part types refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise bad_request(f"{where}: only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string or a list of text parts", "messages")


def chat_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise bad_request(f"messages[{i}] needs a role of system, developer, user or "
                              f"assistant", "messages")
        out.append({"role": _ROLES[m["role"]],
                    "content": _text_content(m.get("content"), f"messages[{i}]")})
    return out


def _check_unsupported(body: Body) -> None:
    if body.dict("logit_bias"):  # an object or null; a non-empty one is refused
        raise bad_request("'logit_bias' is not supported", "logit_bias")
    if body.raw("tools"):
        raise bad_request("'tools' (function calling) is not supported", "tools")
    fmt = body.dict("response_format")
    if fmt and fmt.get("type") != "text":
        raise bad_request("only response_format {'type': 'text'} is supported",
                          "response_format")


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = await read_json(request)
    body.reject_unknown(_FIELDS)
    model = read_model(state, body)
    _check_unsupported(body)
    tok = state.tokenizer
    ids = await state.encode_chat(chat_messages(body.raw("messages")), "messages")
    n = body.int("n", 1, lo=1, hi=MAX_N)
    want_lp = body.bool("logprobs", False)
    n_top = body.int("top_logprobs", 0, lo=0, hi=20)
    if "top_logprobs" in body and not want_lp:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    max_tokens = max_tokens_field(body, ("max_completion_tokens", "max_tokens"),
                                  state.default_max_tokens(len(ids)))
    stream = body.bool("stream", False)
    include_usage = bool(body.dict("stream_options").get("include_usage")) and stream
    params = sampling_params(body, max_tokens, logprobs=n_top if want_lp else None, max_stop=4)
    cid, created = new_id("chatcmpl"), now()

    async with state.run([(ids, p) for p in choice_params(params, n)], "chat",
                         cache_salt(body)) as streams:
        if not stream:
            for s in streams:
                await s.wait()
            choices = [{"index": i, "message": {"role": "assistant", "content": s.text},
                        "logprobs": chat_logprobs(tok, s.token_ids, s.logprobs, n_top)
                        if want_lp else None,
                        "finish_reason": finish_reason(s)} for i, s in enumerate(streams)]
            return web.json_response({"id": cid, "object": "chat.completion",
                                      "created": created, "model": model, "choices": choices,
                                      "usage": usage(streams, len(ids))})
        resp = await sse.open_sse(request)

        def chunk(i: int, delta: dict, reason: str | None = None, lp: dict | None = None) -> dict:
            c = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason}
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [c],
                    **({"usage": None} if include_usage else {})}

        content: dict[int, sse.Frame] = {}  # choice index -> its content chunk, text a hole

        def frames_of(i: int, d: RequestDelta) -> list[bytes]:
            lp = (chat_logprobs(tok, list(d.new_token_ids), list(d.new_logprobs), n_top)
                  if want_lp and d.new_logprobs else None)
            out = []
            if lp is not None:
                out.append(sse.frame(chunk(i, {"content": d.new_text}, None, lp)))
            elif d.new_text:
                f = content.get(i) or content.setdefault(
                    i, sse.Frame(chunk(i, {"content": sse.hole(0)})))
                out.append(f.render(sse.json_str(d.new_text)))
            if d.finished and d.finish_reason != "abort":
                out.append(sse.frame(chunk(i, {}, d.finish_reason)))
            return out

        try:
            for i in range(n):
                await sse.send(resp, chunk(i, {"role": "assistant", "content": ""}))
            await sse.relay(request, resp, streams, frames_of)
            if include_usage:
                await sse.send(resp, {"id": cid, "object": "chat.completion.chunk",
                                      "created": created, "model": model, "choices": [],
                                      "usage": usage(streams, len(ids))})
        except EngineFailure as exc:
            await sse.send(resp, error_body(from_exception(exc, request[REQUEST_ID]), "openai"))
        await sse.close(resp, "[DONE]")
        return resp
