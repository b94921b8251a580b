"""OpenAI ``POST /v1/completions``: prompt(s) as text or ids, n choices, echo, logprobs.

Choices are numbered prompt-major (prompt i, choice j -> index i * n + j) as OpenAI does.
Every choice is its own engine request; they run concurrently and stream interleaved.
"""

from __future__ import annotations

from aiohttp import web

from crucible.engine.engine import RequestDelta
from crucible.server import sse
from crucible.server.errors import bad_request, error_body, from_exception
from crucible.server.fields import Body, read_json, token_id_list
from crucible.server.openai_common import (IGNORED_FIELDS, completion_logprobs, finish_reason,
                                           new_id, now, read_model, usage)
from crucible.server.params import (MAX_N, SAMPLING_FIELDS, cache_salt, choice_params,
                                    max_tokens_field, sampling_params)
from crucible.server.state import REQUEST_ID, STATE, ServerState
from crucible.server.stream import EngineFailure, RequestStream

routes = web.RouteTableDef()
# add_special_tokens is vLLM's: inference-perf sends false for prompts it already ran through
# the chat template (they carry their own BOS), so the count it targets is the one prefilled.
_FIELDS = ("prompt", "max_tokens", "max_completion_tokens", "n", "stream", "logprobs", "echo",
           "logit_bias", "add_special_tokens", *SAMPLING_FIELDS, *IGNORED_FIELDS)


async def _prompts(state: ServerState, raw: object, add_special: bool = True) -> list[list[int]]:
    """``prompt`` as a string, a list of strings, a list of ids or a list of id lists; text
    gets the model's BOS unless ``add_special`` is false (ids are taken as they are)."""
    if isinstance(raw, str):
        raw = [raw]
    elif token_id_list(raw, "prompt") is not None:
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise bad_request("'prompt' must be a string, a list of strings, a list of token ids "
                          "or a list of token-id lists, and not empty", "prompt")
    out = []
    for p in raw:
        if isinstance(p, str):
            if not p:
                raise bad_request("'prompt' is empty", "prompt")
            out.append(await state.encode(p, "prompt", None if add_special else False))
        elif (ids := token_id_list(p, "prompt")) is not None:
            out.append(ids)
        else:
            raise bad_request("each prompt must be a non-empty string or a non-empty list "
                              "of token ids", "prompt")
    return out


def _check_unsupported(body: Body) -> None:
    if body.dict("logit_bias"):  # an object or null; a non-empty one is refused
        raise bad_request("'logit_bias' is not supported", "logit_bias")
    if body.raw("suffix"):
        raise bad_request("'suffix' is not supported", "suffix")
    best_of = body.int("best_of", None, lo=1)
    if best_of is not None and best_of != body.int("n", 1):
        raise bad_request("'best_of' other than n is not supported", "best_of")


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    body = await read_json(request)
    body.reject_unknown(_FIELDS)
    model = read_model(state, body)
    _check_unsupported(body)
    raw_prompt = body.raw("prompt")
    # A flat list of ids is one prompt, however long; only a list of prompts is bounded here
    # (before any of them is tokenised).
    if (isinstance(raw_prompt, list) and len(raw_prompt) > state.config.max_queue
            and not all(type(t) is int for t in raw_prompt)):
        raise bad_request(f"'prompt' lists {len(raw_prompt)} prompts, more than the waiting "
                          f"queue's bound of {state.config.max_queue} (--max-queue)", "prompt")
    prompts = await _prompts(state, raw_prompt, body.bool("add_special_tokens", True))
    n = body.int("n", 1, lo=1, hi=MAX_N)
    n_lp = body.int("logprobs", None, lo=0, hi=20)
    echo = body.bool("echo", False)
    stream = body.bool("stream", False)
    include_usage = bool(body.dict("stream_options").get("include_usage")) and stream
    # max_completion_tokens is accepted as on the chat route (the same limit, 16 if neither).
    max_tokens = max_tokens_field(body, ("max_completion_tokens", "max_tokens"), 16)
    params = sampling_params(body, max_tokens, logprobs=n_lp,
                             prompt_logprobs=n_lp if echo else None, max_stop=4)
    jobs = [(ids, p) for ids in prompts for p in choice_params(params, n)]
    num_prompt = sum(len(ids) for ids in prompts)
    cid, created = new_id("cmpl"), now()
    tok = state.tokenizer

    def prefix(i: int) -> str:
        return tok.decode(prompts[i // n]) if echo else ""

    def choice(i: int, s: RequestStream) -> dict:
        lp = None
        if n_lp is not None:
            ids, lps = s.token_ids, list(s.logprobs)
            if echo:
                ids = s.prompt_token_ids + ids
                lps = list(s.prompt_logprobs or [None] * s.num_prompt_tokens) + lps
            lp = completion_logprobs(tok, ids, lps, n_lp)
        return {"index": i, "text": prefix(i) + s.text, "logprobs": lp,
                "finish_reason": finish_reason(s)}

    async with state.run(jobs, "cmpl", cache_salt(body)) as streams:
        if not stream:
            for s in streams:
                await s.wait()
            return web.json_response({
                "id": cid, "object": "text_completion", "created": created, "model": model,
                "choices": [choice(i, s) for i, s in enumerate(streams)],
                "usage": usage(streams, num_prompt)})
        resp = await sse.open_sse(request)

        def chunk(i: int, text: str, reason: str | None, lp: dict | None = None) -> dict:
            c = {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
            return {"id": cid, "object": "text_completion", "created": created,
                    "model": model, "choices": [c], **({"usage": None} if include_usage else {})}

        frames: dict[int, sse.Frame] = {}  # choice index -> its chunk with text and reason holes

        def frames_of(i: int, d: RequestDelta) -> list[bytes]:
            lp = None
            if n_lp is not None and d.new_logprobs:
                lp = completion_logprobs(tok, list(d.new_token_ids), list(d.new_logprobs), n_lp)
            if not (d.new_text or d.finished or lp is not None):
                return []
            reason = d.finish_reason if d.finished and d.finish_reason != "abort" else None
            if lp is not None:
                return [sse.frame(chunk(i, d.new_text, reason, lp))]
            f = frames.get(i) or frames.setdefault(i, sse.Frame(chunk(i, sse.hole(0),
                                                                      sse.hole(1))))
            return [f.render(sse.json_str(d.new_text), sse.reason_json(reason))]

        try:
            if echo:
                for i in range(len(streams)):
                    await sse.send(resp, chunk(i, prefix(i), None))
            await sse.relay(request, resp, streams, frames_of)
            if include_usage:
                await sse.send(resp, {"id": cid, "object": "text_completion", "created": created,
                                      "model": model, "choices": [],
                                      "usage": usage(streams, num_prompt)})
        except EngineFailure as exc:
            await sse.send(resp, error_body(from_exception(exc, request[REQUEST_ID]), "openai"))
        await sse.close(resp, "[DONE]")
        return resp
