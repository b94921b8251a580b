"""Anthropic ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Messages (system, alternating user/assistant turns, text blocks) render through the model's
chat template; a final assistant turn is a prefill the model continues. Stop reasons:
``end_turn`` (an end-of-turn/EOS token), ``max_tokens``, ``stop_sequence`` (with the
sequence). Streams emit message_start, content_block_start, ping, content_block_delta...,
content_block_stop, message_delta (stop reason + usage), message_stop. Unknown fields are
refused, as Anthropic's API does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from crucible.server import sse
from crucible.server.errors import bad_request, error_body, from_exception
from crucible.server.fields import Body, read_json
from crucible.server.openai_common import read_model
from crucible.server.params import cache_salt, sampling_params
from crucible.server.state import REQUEST_ID, STATE, ServerState, hex_id
from crucible.server.stream import EngineFailure, RequestStream

routes = web.RouteTableDef()
_FIELDS = ("model", "messages", "system", "max_tokens", "stop_sequences", "temperature",
           "top_k", "top_p", "stream", "tools", "tool_choice", "thinking", "cache_salt",
           # Sent by newer SDKs; nothing here depends on them, so they are accepted and ignored.
           "metadata", "service_tier", "cache_control", "inference_geo", "speed",
           "user_profile_id", "workspace_id", "diagnostics", "output_config", "container")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(
                    block.get("text"), str):
                raise bad_request(f"{where}: only text content blocks are supported")
            out.append(block["text"])
        return "".join(out)
    raise bad_request(f"{where}: content must be a string or a list of text blocks")


async def prompt_ids(state: ServerState, body: Body) -> list[int]:
    raw = body.raw("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages: must be a non-empty list")
    msgs = []
    if "system" in body:
        msgs.append({"role": "system", "content": _text(body.raw("system"), "system")})
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"messages.{i}.role: must be 'user' or 'assistant'")
        msgs.append({"role": m["role"], "content": _text(m.get("content"), f"messages.{i}")})
    if msgs[-1]["role"] == "user" or len(msgs) == 1:
        prefill = ""
    else:
        prefill = msgs.pop()["content"]  # the reply starts with this text
    return await state.encode_chat(msgs, "messages", True, prefill)


async def _reading(state: ServerState, body: Body) -> tuple[str, list[int]]:
    body.reject_unknown(_FIELDS)
    model = read_model(state, body)
    for name in ("tools", "thinking"):
        if body.raw(name):
            raise bad_request(f"{name}: not supported by this server")
    return model, await prompt_ids(state, body)


def _stop(state: ServerState, s: RequestStream) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished stream."""
    if s.finish_reason == "length":
        return "max_tokens", None
    if s.finish_reason != "stop":
        return None, None
    last = s.token_ids[-1] if s.token_ids else None
    if s.params.stop and last not in state.tokenizer.stop_token_ids:
        # The text ends where a stop sequence began: find which one starts there.
        full = state.tokenizer.decode(s.token_ids, skip_special_tokens=True)
        for seq in s.params.stop:
            if full.startswith(seq, len(s.text)):
                return "stop_sequence", seq
        hits = [seq for seq in s.params.stop if seq in full]
        return "stop_sequence", (hits[0] if hits else s.params.stop[0])
    return "end_turn", None


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = await read_json(request)
    model, ids = await _reading(state, body)
    stops = body.raw("stop_sequences", [])
    if not isinstance(stops, list):
        raise bad_request("stop_sequences: must be a list of strings")
    params = sampling_params(body, body.int("max_tokens", lo=1), stop_field="stop_sequences",
                             extra={"temperature": body.float("temperature", 1.0, lo=0, hi=1),
                                    "top_k": body.int("top_k", None, lo=1)})
    mid = f"msg_{hex_id()}"
    headers = {"request-id": request[REQUEST_ID]}

    def message(s: RequestStream | None, content: list, reason: str | None,
                seq: str | None) -> dict:
        return {"id": mid, "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": reason, "stop_sequence": seq,
                "usage": {"input_tokens": len(ids),
                          "cache_read_input_tokens": s.num_cached_tokens if s else 0,
                          "output_tokens": s.num_output_tokens if s else 0}}

    async with state.run([(ids, params)], "msg", cache_salt(body)) as (s,):
        if not body.bool("stream", False):
            await s.wait()
            reason, seq = _stop(state, s)
            return web.json_response(message(s, [{"type": "text", "text": s.text}],
                                             reason, seq), headers=headers)
        resp = await sse.open_sse(request, headers)
        await sse.send(resp, {"type": "message_start", "message": message(None, [], None, None)},
                       "message_start")
        await sse.send(resp, {"type": "content_block_start", "index": 0,
                              "content_block": {"type": "text", "text": ""}},
                       "content_block_start")
        await sse.send(resp, {"type": "ping"}, "ping")
        text_delta = sse.Frame({"type": "content_block_delta", "index": 0,
                                "delta": {"type": "text_delta", "text": sse.hole(0)}},
                               "content_block_delta")
        try:
            await sse.relay(request, resp, [s], lambda _, d: [
                text_delta.render(sse.json_str(d.new_text))] if d.new_text else [])
        except EngineFailure as exc:
            await sse.send(resp, error_body(from_exception(exc, request[REQUEST_ID]), "anthropic"), "error")
            await sse.close(resp)
            return resp
        reason, seq = _stop(state, s)
        await sse.send(resp, {"type": "content_block_stop", "index": 0}, "content_block_stop")
        await sse.send(resp, {"type": "message_delta",
                              "delta": {"stop_reason": reason, "stop_sequence": seq},
                              "usage": {"output_tokens": s.num_output_tokens,
                                        "cache_read_input_tokens": s.num_cached_tokens}},
                       "message_delta")
        await sse.close(resp, {"type": "message_stop"}, "message_stop")
        return resp


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    body = await read_json(request)
    _, ids = await _reading(state, body)
    return web.json_response({"input_tokens": len(ids)},
                             headers={"request-id": request[REQUEST_ID]})
