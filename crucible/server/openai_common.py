"""Pieces shared by the OpenAI adapters: /v1/models, the model check, logprobs, usage.

/v1/models answers both SDKs: OpenAI's client reads ``object``/``id``/``owned_by``,
Anthropic's reads ``type``/``id``/``display_name``/``created_at`` plus ``has_more``,
``first_id`` and ``last_id``; one body carries both field sets, so there is no need to
sniff which client is asking.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from aiohttp import web

from crucible.engine.engine import Logprobs
from crucible.server.errors import ApiError
from crucible.server.fields import Body
from crucible.server.state import STATE, ServerState, hex_id
from crucible.server.stream import RequestStream

routes = web.RouteTableDef()

# Fields OpenAI clients commonly send that change nothing here; accepted and ignored.
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier", "parallel_tool_calls",
                  "stream_options", "model", "suffix", "best_of")


def model_card(state: ServerState) -> dict:
    name = state.config.model_name
    return {"id": name, "object": "model", "created": state.created, "owned_by": "crucible",
            "root": name, "parent": None, "max_model_len": state.max_context,
            "type": "model", "display_name": name,
            "created_at": datetime.fromtimestamp(state.created, timezone.utc)
            .isoformat().replace("+00:00", "Z")}


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    name = state.config.model_name
    return web.json_response({"object": "list", "data": [model_card(state)],
                              "has_more": False, "first_id": name, "last_id": name})


@routes.get("/v1/models/{model_id}")
async def get_model(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    check_model(state, request.match_info["model_id"])
    return web.json_response(model_card(state))


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.config.model_name:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves "
                            f"'{state.config.model_name}'", param="model",
                       code="model_not_found")


def read_model(state: ServerState, body: Body, required: bool = True) -> str:
    model = body.str("model") if required else body.str("model", None)
    check_model(state, model)
    return state.config.model_name


def new_id(prefix: str) -> str:
    return f"{prefix}-{hex_id()}"


def now() -> int:
    return int(time.time())


def usage(streams: list[RequestStream], num_prompt: int) -> dict:
    """Prompt tokens count once per distinct prompt, completion tokens over all choices;
    ``cached_tokens``: the prompt tokens read from the prefix cache (per distinct prompt, the
    most any of its choices found)."""
    completion = sum(s.num_output_tokens for s in streams)
    cached: dict[int, int] = {}
    for s in streams:
        key = id(s.prompt_token_ids)
        cached[key] = max(cached.get(key, 0), s.num_cached_tokens)
    return {"prompt_tokens": num_prompt, "completion_tokens": completion,
            "total_tokens": num_prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}


def finish_reason(s: RequestStream) -> str | None:
    return None if s.finish_reason == "abort" else s.finish_reason


def token_str(tok, token_id: int) -> str:
    return tok.decode([token_id])


def completion_logprobs(tok, ids: list[int], lps: list[Logprobs | None], n_top: int,
                        text_offset: int = 0) -> dict:
    """The legacy completions ``logprobs`` object (tokens, token_logprobs, top_logprobs)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    pos = text_offset
    for t, lp in zip(ids, lps):
        s = token_str(tok, t)
        tokens.append(s)
        offsets.append(pos)
        pos += len(s)
        token_lps.append(None if lp is None else lp[t])
        tops.append(None if lp is None else
                    {token_str(tok, k): v for k, v in list(lp.items())[:n_top]})
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(tok, ids: list[int], lps: list[Logprobs], n_top: int) -> dict:
    """The chat ``logprobs`` object: one entry per token with its top alternatives."""
    def entry(t: int, v: float) -> dict:
        return {"token": token_str(tok, t), "logprob": v, "bytes": list(tok.token_bytes(t))}

    content = []
    for t, lp in zip(ids, lps):
        content.append({**entry(t, lp[t]),
                        "top_logprobs": [entry(k, v) for k, v in list(lp.items())[:n_top]]})
    return {"content": content, "refusal": None}
