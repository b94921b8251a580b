"""Native API: /generate, /health, /metrics, /tokenize, /detokenize, /tokenizer_info
(vLLM-like shapes).

/generate takes text (``prompt``) or ids (``prompt_token_ids``), the shared sampling fields
and ``stream``; it answers with text, ids, finish reason and usage, or an SSE stream of
increments ending in ``data: [DONE]``. Unknown fields are refused: this API is ours, so a
misspelt field is more likely a bug than an extension.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from crucible.engine.engine import RequestDelta
from crucible.server import sse
from crucible.server.errors import RETRY_AFTER_S, bad_request, error_body, from_exception
from crucible.server.fields import Body, read_json, token_id_list
from crucible.server.params import SAMPLING_FIELDS, cache_salt, sampling_params
from crucible.server.state import REQUEST_ID, STATE, ServerState
from crucible.server.stream import EngineFailure, RequestStream

routes = web.RouteTableDef()
_GENERATE_FIELDS = ("prompt", "prompt_token_ids", "max_tokens", "stream", "logprobs",
                    "add_special_tokens", *SAMPLING_FIELDS)


def _state(request: web.Request) -> ServerState:
    return request.app[STATE]


async def prompt_ids(state: ServerState, body: Body, add_special: bool = True) -> list[int]:
    """Token ids from ``prompt`` (text) or ``prompt_token_ids``; exactly one must be given."""
    if ("prompt" in body) == ("prompt_token_ids" in body):
        raise bad_request("give exactly one of 'prompt' (text) or 'prompt_token_ids'", "prompt")
    if "prompt" in body:
        text = body.str("prompt")
        if not text:
            raise bad_request("'prompt' is empty", "prompt")
        return await state.encode(text, "prompt", add_bos=None if add_special else False)
    ids = token_id_list(body.raw("prompt_token_ids"), "prompt_token_ids")
    if ids is None:
        raise bad_request("'prompt_token_ids' must be a non-empty list of integers",
                          "prompt_token_ids")
    return ids


def _result(s: RequestStream) -> dict:
    out = {"id": s.request_id, "text": s.text, "token_ids": s.token_ids,
           "finish_reason": s.finish_reason,
           "usage": {"prompt_tokens": s.num_prompt_tokens,
                     "completion_tokens": s.num_output_tokens,
                     "total_tokens": s.num_prompt_tokens + s.num_output_tokens}}
    if s.params.logprobs is not None:
        out["logprobs"] = [{str(k): v for k, v in lp.items()} for lp in s.logprobs]
    return out


@routes.post("/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    body = await read_json(request)
    body.reject_unknown(_GENERATE_FIELDS)
    ids = await prompt_ids(state, body, body.bool("add_special_tokens", True))
    params = sampling_params(body, body.int("max_tokens", 16, lo=1),
                             logprobs=body.int("logprobs", None, lo=0, hi=20))
    stream = body.bool("stream", False)
    async with state.run([(ids, params)], "gen", cache_salt(body)) as (s,):
        if not stream:
            await s.wait()
            return web.json_response(_result(s))
        resp = await sse.open_sse(request, {"X-Request-Id": s.request_id})
        piece = sse.Frame({"id": s.request_id, "text": sse.hole(0), "token_ids": sse.hole(1),
                           "finish_reason": sse.hole(2)})

        def frames_of(_: int, d: RequestDelta) -> list[bytes]:
            ids = "[" + ", ".join(map(str, d.new_token_ids)) + "]"  # json.dumps' own form
            return [piece.render(sse.json_str(d.new_text), ids,
                                 sse.reason_json(d.finish_reason if d.finished else None))]

        try:
            await sse.relay(request, resp, [s], frames_of)
        except EngineFailure as exc:
            await sse.send(resp, error_body(from_exception(exc, request[REQUEST_ID]), "native"))
        await sse.close(resp, "[DONE]")
        return resp


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    state = _state(request)
    ok, reason = state.health()
    # While the engine loads, a retry soon will find it ready (load balancers honour it).
    hdrs = {"Retry-After": str(RETRY_AFTER_S)} if state.loading else None
    return web.json_response({"status": "ok" if ok else "unavailable", "detail": reason},
                             status=200 if ok else 503, headers=hdrs)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    state = _state(request)
    loop = state.engine_loop
    text = state.metrics.render(loop.stats if loop else {}, healthy=state.health()[0],
                                queue_bound=state.config.max_queue,
                                others=loop.other_fronts if loop else ())
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_json(request)
    body.reject_unknown(("prompt", "messages", "add_special_tokens", "add_generation_prompt",
                         "return_token_strs", "model"))
    tok = state.tokenizer
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("give exactly one of 'prompt' or 'messages'", "prompt")
    if "prompt" in body:
        add = body.bool("add_special_tokens", True)
        ids = await state.encode(body.str("prompt"), "prompt", add_bos=None if add else False)
    else:
        from crucible.server.openai_chat import chat_messages

        ids = await state.encode_chat(chat_messages(body.raw("messages")), "messages",
                                      body.bool("add_generation_prompt", True))
    out: dict = {"count": len(ids), "max_model_len": state.max_context, "tokens": ids}
    if body.bool("return_token_strs", False):
        out["token_strs"] = [tok.id_to_token(t) for t in ids]
    return web.json_response(out)


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_json(request)
    body.reject_unknown(("tokens", "model"))
    v = body.raw("tokens")
    ids = [] if v == [] else token_id_list(v, "tokens")
    if ids is None:
        raise bad_request("'tokens' must be a list of integers", "tokens")
    if len(ids) > state.max_prompt_chars:
        raise bad_request(f"'tokens' has {len(ids)} ids, more than the {state.max_prompt_chars} "
                          f"this server decodes at once", "tokens")
    if len(ids) < 4096:
        text = state.tokenizer.decode(ids)
    else:
        text = await asyncio.get_running_loop().run_in_executor(
            state.tokenize_pool, state.tokenizer.decode, ids)
    return web.json_response({"prompt": text})


@routes.get("/tokenizer_info")
async def tokenizer_info(request: web.Request) -> web.Response:
    """vLLM's ``GET /tokenizer_info``: the tokenizer's config as HF's tokenizer_config.json
    names it, plus the chat template this server renders (the model's own, or ChatML when
    the model has none: ``chat_template_is_fallback``). lm-evaluation-harness asks for it
    first. ``model_max_length`` is the context the server serves."""
    state = _state(request)
    tok = state.tokenizer

    def token(tid: int | None) -> str | None:
        return None if tid is None else tok.id_to_token(tid)

    return web.json_response({
        "tokenizer_class": "PreTrainedTokenizerFast",  # a tokenizer.json (tokenizers) model
        "model_max_length": state.max_context,
        "vocab_size": tok.vocab_size,
        "bos_token": token(tok.bos_token_id), "bos_token_id": tok.bos_token_id,
        "eos_token": token(tok.eos_token_id), "eos_token_id": tok.eos_token_id,
        "add_bos_token": tok.add_bos, "add_eos_token": False,
        "stop_token_ids": list(tok.stop_token_ids),
        "chat_template": tok.chat_template.source,
        "chat_template_is_fallback": not tok.has_chat_template,
    })
