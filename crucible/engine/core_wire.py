"""The engine process's wire format: bytes over a ``multiprocessing.connection`` pipe.

Every message is one ``send_bytes`` frame whose first byte says what it is. The per-step
batch (the hot path: one frame per step, however many requests it served) is a struct
header, the engine's counters as int64 and flat numpy arrays: request handles, new token
ids, finish codes, cached-token counts, and logprobs as (count, ids, values) runs. Nothing
per token is pickled or written as JSON. Control messages (ready, load failure, refusals,
stats replies) are rare and small, so they are a tag byte plus JSON text; an add is a
struct header, its sampling fields as JSON and the prompt ids as int32.

Logprob values travel as float64: the host sampler computes them in f64, and f32 would
change the numbers a client sees against the in-process server. Requests are named on the
wire by a 32-bit handle the front assigns, so a step frame carries no strings.
"""

from __future__ import annotations

import json
import struct
from dataclasses import fields
from typing import Any, NamedTuple, Sequence

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from crucible.backend.protocol import GRAPH_STATS
from crucible.engine.engine import Logprobs, RequestDelta
from crucible.engine.sampling import SamplingParams
from crucible.model.tokenizer import Tokenizer

# front -> engine process (FRONT_METRICS: a front's own metrics, when several fronts serve)
ADD, ABORT, STATS, SHUTDOWN, FRONT_METRICS = 1, 2, 3, 4, 5
# engine process -> front (FRONTS: the other fronts' latest metrics, the answer to one)
READY, LOAD_FAILED, STEP, REFUSED, FAILED, STATS_REPLY, FRONTS = 16, 17, 18, 19, 20, 21, 22

# The engine's counters, in the order every step frame carries them. ``adds_seen`` counts
# the add messages the process has taken in, so the front knows which of its adds the
# ``waiting`` count already includes.
STATS_KEYS = ("pages_total", "pages_free", "running", "waiting", "steps", "preemptions",
              "rows_computed", "tokens_generated", "cache_queries", "cache_hits",
              "cache_hit_tokens", "cache_admissions", "cache_evictions", "cache_pages",
              "cache_resident_bytes", "cache_fill_waits", "waiting_preempted", "adds_seen",
              *GRAPH_STATS)

REASONS = ("stop", "length", "abort")  # finish codes 0, 1, 2; -1: not finished
_CODE = {r: i for i, r in enumerate(REASONS)}
_ADD = struct.Struct("<BIIH")  # tag, handle, prompt length, JSON length
# tag, has-logprob-groups bits, deltas, tokens, (items, entries) of each logprob group
_STEP = struct.Struct("<BBIIIIII")
_COUNTERS = struct.Struct(f"<{len(STATS_KEYS)}q")
_I32, _U32, _F64 = np.dtype("<i4"), np.dtype("<u4"), np.dtype("<f8")
# SamplingParams' fields are flat (numbers, strings, tuples of them), so a shallow dict is
# its JSON; asdict's deep copy cost ~100 us an add.
_PARAMS = tuple(f.name for f in fields(SamplingParams))


class WireDelta(NamedTuple):
    """One request's share of a step, as the front reads it (ids, no text)."""

    handle: int
    token_ids: tuple[int, ...]
    finish_reason: str | None  # None while it runs
    num_cached_tokens: int
    logprobs: tuple[Logprobs, ...] | None
    prompt_logprobs: tuple[Logprobs | None, ...] | None


# -- control messages ---------------------------------------------------------------------

def encode_json(tag: int, payload: dict[str, Any]) -> bytes:
    return bytes([tag]) + json.dumps(payload, separators=(",", ":")).encode()


def decode_json(data: bytes) -> dict[str, Any]:
    return json.loads(data[1:])


def encode_add(handle: int, request_id: str, prompt: Sequence[int], params: SamplingParams,
               *, final_only: bool = False, cache_salt: str | None = None,
               use_prefix_cache: bool = True) -> bytes:
    meta = json.dumps({"rid": request_id,
                       "params": {k: getattr(params, k) for k in _PARAMS},
                       "final_only": final_only,
                       "cache_salt": cache_salt, "use_prefix_cache": use_prefix_cache},
                      separators=(",", ":")).encode()
    ids = np.asarray(prompt, dtype=_I32)
    return _ADD.pack(ADD, handle, ids.size, len(meta)) + meta + ids.tobytes()


def decode_add(data: bytes) -> tuple[int, np.ndarray, dict[str, Any]]:
    """(handle, prompt ids as an int32 array, meta) where meta["params"] is a SamplingParams
    again. The engine checks the array (two C scans) before it takes the ids as a list."""
    _, handle, n, m = _ADD.unpack_from(data)
    start = _ADD.size
    meta = json.loads(data[start : start + m])
    meta["params"] = SamplingParams(**meta["params"])
    return handle, np.frombuffer(data, _I32, n, start + m), meta


def encode_abort(handles: Sequence[int]) -> bytes:
    return bytes([ABORT]) + np.asarray(handles, dtype=_U32).tobytes()


def decode_abort(data: bytes) -> list[int]:
    return np.frombuffer(data, _U32, offset=1).tolist()


# -- the step frame -----------------------------------------------------------------------

def _put_lists(lists: Sequence[Sequence[Logprobs | None] | None], lengths: list[int],
               counts: list[int], ids: list[int], vals: list[float]) -> None:
    """Flatten optional lists of optional {token: logprob} dicts (order kept)."""
    for lst in lists:
        if lst is None:
            lengths.append(-1)
            continue
        lengths.append(len(lst))
        for lp in lst:
            if lp is None:
                counts.append(-1)
            else:
                counts.append(len(lp))
                ids.extend(lp)
                vals.extend(lp.values())


def encode_step(deltas: Sequence[tuple[int, RequestDelta]], counters: Sequence[int]) -> bytes:
    """One frame for a whole step: ``(handle, delta)`` for every request it served."""
    handles, lengths, codes, cached, tokens = [], [], [], [], []
    for h, d in deltas:
        handles.append(h)
        lengths.append(len(d.new_token_ids))
        tokens.extend(d.new_token_ids)
        codes.append(_CODE[d.finish_reason] if d.finished else -1)
        cached.append(d.num_cached_tokens)
    arrays = [np.asarray(handles, dtype=_U32), lengths, codes, cached, tokens]
    groups, sizes = 0, []
    for bit, pick in ((1, lambda d: d.new_logprobs), (2, lambda d: d.prompt_logprobs)):
        lists = [pick(d) for _, d in deltas]
        if all(x is None for x in lists):
            sizes += [0, 0]
            continue
        groups |= bit
        ln, counts, ids, vals = [], [], [], []
        _put_lists(lists, ln, counts, ids, vals)
        arrays += [ln, counts, ids]
        sizes += [len(counts), len(ids)]
        arrays.append(np.asarray(vals, dtype=_F64))
    head = _STEP.pack(STEP, groups, len(handles), len(tokens), *sizes)
    body = b"".join(a.tobytes() if isinstance(a, np.ndarray) else
                    np.asarray(a, dtype=_I32).tobytes() for a in arrays)
    return head + _COUNTERS.pack(*counters) + body


class _Reader:
    """Sequential reads of typed runs from one frame."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos

    def take(self, dtype: np.dtype, n: int) -> list:
        out = np.frombuffer(self.data, dtype, n, self.pos).tolist() if n else []
        self.pos += n * dtype.itemsize
        return out


def _take_lists(r: _Reader, n: int, items: int, entries: int
                ) -> list[tuple[Logprobs | None, ...] | None]:
    lengths, counts = r.take(_I32, n), r.take(_I32, items)
    ids, vals = r.take(_I32, entries), r.take(_F64, entries)
    out: list[tuple[Logprobs | None, ...] | None] = []
    c = e = 0
    for length in lengths:
        if length < 0:
            out.append(None)
            continue
        lst: list[Logprobs | None] = []
        for k in counts[c : c + length]:
            if k < 0:
                lst.append(None)
            else:
                lst.append(dict(zip(ids[e : e + k], vals[e : e + k])))
                e += k
        c += length
        out.append(tuple(lst))
    return out


def decode_step(data: bytes) -> tuple[dict[str, int], list[WireDelta]]:
    _, groups, n, t, a_items, a_entries, b_items, b_entries = _STEP.unpack_from(data)
    counters = dict(zip(STATS_KEYS, _COUNTERS.unpack_from(data, _STEP.size)))
    r = _Reader(data, _STEP.size + _COUNTERS.size)
    handles = r.take(_U32, n)
    lengths, codes, cached = (r.take(_I32, n) for _ in range(3))
    tokens = r.take(_I32, t)
    none: list = [None] * n
    lps = _take_lists(r, n, a_items, a_entries) if groups & 1 else none
    plps = _take_lists(r, n, b_items, b_entries) if groups & 2 else none
    out, pos = [], 0
    for i in range(n):
        k = lengths[i]
        out.append(WireDelta(handles[i], tuple(tokens[pos : pos + k]),
                             REASONS[codes[i]] if codes[i] >= 0 else None, cached[i],
                             lps[i], plps[i]))  # type: ignore[arg-type]
        pos += k
    return counters, out


# -- the ready message's tokenizer --------------------------------------------------------

def tokenizer_payload(tok: Tokenizer) -> dict[str, Any]:
    """Everything that rebuilds ``tok`` exactly (the fields the prepared-model file keeps),
    so the front tokenises and detokenises with the engine's own tokenizer."""
    return {"json": tok.backend.to_str(), "bos": tok.bos_token_id, "eos": tok.eos_token_id,
            "add_bos": tok.add_bos, "byte_level": tok.byte_level,
            "stops": list(tok.stop_token_ids), "source": tok.source,
            "chat_template": tok.chat_template.source if tok.has_chat_template else None,
            "model_vocab": tok.model_vocab_size}


def tokenizer_from_payload(p: dict[str, Any]) -> Tokenizer:
    tok = Tokenizer(HFTokenizer.from_str(p["json"]), bos_token_id=p["bos"],
                    eos_token_id=p["eos"], add_bos=p["add_bos"],
                    chat_template=p["chat_template"], extra_stop_ids=p["stops"],
                    byte_level=p["byte_level"], source=p["source"])
    tok.cover(p["model_vocab"])  # the model's padding ids decode to no text in the front too
    return tok
