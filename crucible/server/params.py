"""Sampling fields shared by the native and OpenAI APIs -> ``SamplingParams``.

Ranges follow the OpenAI API where it defines one (temperature 0-2, penalties -2..2,
top_p in (0, 1]) and vLLM's extensions otherwise (top_k -1/0 = off, min_p, min_tokens,
repetition_penalty, ignore_eos, stop_token_ids). Anything SamplingParams still rejects
comes back as a 400 with its own message.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from crucible.engine.sampling import SamplingParams
from crucible.errors import RequestError
from crucible.server.errors import bad_request
from crucible.server.fields import MAX_STOP, MAX_STOP_TOKEN_IDS, Body

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                   "presence_penalty", "frequency_penalty", "repetition_penalty",
                   "min_tokens", "ignore_eos", "cache_salt")
MAX_N = 16


def sampling_params(body: Body, max_tokens: int, *, logprobs: int | None = None,
                    prompt_logprobs: int | None = None, max_stop: int = MAX_STOP,
                    stop_field: str = "stop",
                    extra: dict[str, Any] | None = None) -> SamplingParams:
    top_k = body.int("top_k", None, lo=-1)
    stop_ids = body.raw("stop_token_ids", [])
    if not isinstance(stop_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_ids):
        raise bad_request("'stop_token_ids' must be a list of non-negative integers",
                          "stop_token_ids")
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise bad_request(f"'stop_token_ids' takes at most {MAX_STOP_TOKEN_IDS} ids, got "
                          f"{len(stop_ids)}", "stop_token_ids")
    kwargs: dict[str, Any] = dict(
        max_tokens=max_tokens,
        temperature=body.float("temperature", 1.0, lo=0.0, hi=2.0),
        top_p=body.float("top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        top_k=None if top_k in (None, -1, 0) else top_k,
        min_p=body.float("min_p", 0.0, lo=0.0, hi=1.0),
        seed=body.int("seed", None, lo=0, hi=2**63 - 1),
        stop=body.stop_list(stop_field, max_stop),
        stop_token_ids=tuple(stop_ids),
        presence_penalty=body.float("presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=body.float("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        repetition_penalty=body.float("repetition_penalty", 1.0, lo=0.0, hi=10.0, lo_open=True),
        min_tokens=body.int("min_tokens", 0, lo=0),
        ignore_eos=body.bool("ignore_eos", False),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
    kwargs.update(extra or {})
    try:
        return SamplingParams(**kwargs)
    except RequestError as exc:
        raise bad_request(str(exc)) from None


def max_tokens_field(body: Body, names: tuple[str, ...], default: int | None) -> int | None:
    """The token limit under any of ``names`` (e.g. max_completion_tokens, max_tokens), each
    an integer >= 1; several given must agree, else a 400 naming them."""
    given = [(name, body.int(name, lo=1)) for name in names if name in body]
    if not given:
        return default
    if len({v for _, v in given}) > 1:
        listed = " and ".join(f"'{n}' ({v})" for n, v in given)
        raise bad_request(f"{listed} differ; send one of them, or the same value in both",
                          given[0][0])
    return given[0][1]


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """Params for n choices: with a seed, choice i uses seed + i so choices differ."""
    if n == 1 or params.seed is None:
        return [params] * n
    return [replace(params, seed=params.seed + i) for i in range(n)]


MAX_SALT = 256  # characters of a cache_salt


def cache_salt(body: Body) -> str | None:
    """``cache_salt`` (OpenAI and vLLM spell it so): requests share prefix-cache pages only
    with requests of the same salt."""
    salt = body.raw("cache_salt", None)
    if salt is None:
        return None
    if not isinstance(salt, str) or not 0 < len(salt) <= MAX_SALT:
        raise bad_request(f"'cache_salt' must be a non-empty string of at most {MAX_SALT} "
                          "characters", "cache_salt")
    return salt
