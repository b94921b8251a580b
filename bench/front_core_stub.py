"""An engine stand-in for the front-capacity bench: the real engine-core process loop and
wire (crucible/engine/core_process.py, core_wire.py) around a fake ``LLMEngine`` that makes
token ids as fast as it is told instead of running a model.

``EngineProcessConfig(model=spec_json(...), factory="front_core_stub:fake_engine")`` has
the engine process import this module (spawn hands the child the parent's ``sys.path``,
which holds bench/). A step gives every running request ``tokens_per_step`` new ids, in one
frame for the whole step, as the real engine does; steps are paced to ``step_rate`` per
second (0: back to back). The ids are a real tokenizer's encoding of real English text
(crucible/data/heldout_en.txt), each request starting at its own offset, so the front's
detokenising does the work it does for a real model. A request ends with ``length`` at its
``max_tokens``; stop ids and stop strings are not checked here (the bench sends
``ignore_eos`` and no stops), and the front does stop strings itself anyway.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from crucible.backend.protocol import GRAPH_STATS
from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.engine.factory import EngineInfo, load
from crucible.engine.sampling import SamplingParams
from crucible.engine.settings import Settings
from crucible.errors import QueueFullError

CORPUS = Path(__file__).resolve().parent.parent / "crucible" / "data" / "heldout_en.txt"


def spec_json(tokenizer: str, step_rate: float, tokens_per_step: int = 1) -> str:
    """The ``model`` string the front passes through to ``fake_engine``."""
    return json.dumps({"tokenizer": tokenizer, "step_rate": step_rate,
                       "tokens_per_step": tokens_per_step})


class _Live:
    __slots__ = ("rid", "left", "pos")

    def __init__(self, rid: str, max_tokens: int, pos: int) -> None:
        self.rid, self.left, self.pos = rid, max_tokens, pos


class FakeEngine:
    """What EngineCore calls on an LLMEngine, and nothing more."""

    # EngineCore checks each add itself (a second line behind the front's): the real check,
    # on this engine's limits, as the front's EngineLimits has it.
    check_request, checked_ids = LLMEngine.check_request, LLMEngine.checked_ids

    def __init__(self, tokenizer: Any, settings: Settings, step_rate: float,
                 tokens_per_step: int, max_context: int) -> None:
        self.tokenizer = tokenizer
        self.detokenize = True  # EngineCore turns it off; ids are all this engine makes
        self.pacer = None  # no late planning (engine/pacing.py): steps come at step_rate
        self.vocab_size = tokenizer.vocab_size
        self.max_context = max_context
        self.config = SimpleNamespace(max_queue=settings.max_queue)
        self.allocator = SimpleNamespace(num_pages=settings.num_pages or 65536,
                                         num_free=settings.num_pages or 65536)
        self.scheduler = SimpleNamespace(waiting=(), running=())
        ids = tokenizer.encode(CORPUS.read_text(), add_bos=False)
        self.corpus = ids * 2  # a request reads a window anywhere without wrapping
        self.period = len(ids)
        self.tps = tokens_per_step
        self.interval = 1.0 / step_rate if step_rate > 0 else 0.0
        self.next_step = 0.0
        self.live: dict[str, _Live] = {}
        self.num_steps = self.num_generated = self.num_added = 0

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams,
                    request_id: str, **_: Any) -> str:
        if len(self.live) >= 4 * self.config.max_queue + 4096:
            raise QueueFullError("the fake engine holds too many requests")
        self.num_added += 1
        pos = (self.num_added * 7919 + len(prompt_token_ids)) % self.period
        self.live[request_id] = _Live(request_id, params.max_tokens, pos)
        return request_id

    def abort(self, request_id: str) -> bool:
        return self.live.pop(request_id, None) is not None

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def step(self) -> list[RequestDelta]:
        if self.interval:  # hold the step rate: a step ends no earlier than its slot
            now = time.perf_counter()
            if self.next_step > now:
                time.sleep(self.next_step - now)
            self.next_step = max(now, self.next_step) + self.interval
        out, ended, corpus = [], [], self.corpus
        for r in self.live.values():
            k = min(self.tps, r.left)
            ids = tuple(corpus[r.pos : r.pos + k])
            r.pos = (r.pos + k) % self.period
            r.left -= k
            done = r.left == 0
            out.append(RequestDelta(r.rid, ids, "", None, None, done,
                                    "length" if done else None, 0))
            if done:
                ended.append(r.rid)
        for rid in ended:
            del self.live[rid]
        self.num_steps += 1
        self.num_generated += sum(len(d.new_token_ids) for d in out)
        return out

    def stats(self) -> dict[str, int]:
        st = dict.fromkeys(("preemptions", "rows_computed", "cache_queries", "cache_hits",
                            "cache_hit_tokens", "cache_admissions", "cache_evictions",
                            "cache_pages", "cache_resident_bytes", "cache_fill_waits"), 0)
        st.update(pages_total=self.allocator.num_pages, pages_free=self.allocator.num_free,
                  running=len(self.live), waiting=0, steps=self.num_steps,
                  tokens_generated=self.num_generated)
        st.update(dict.fromkeys(GRAPH_STATS, 0))  # no forward, no graphs
        return st


def fake_engine(model: str, settings: Settings) -> tuple[FakeEngine, EngineInfo]:
    """The factory the engine process calls, as it would call ``build_engine``."""
    spec = json.loads(model)
    loaded = load(spec["tokenizer"], settings)
    ctx = loaded.config.max_context
    engine = FakeEngine(loaded.tokenizer, settings, float(spec["step_rate"]),
                        int(spec["tokens_per_step"]), ctx)
    info = EngineInfo(model=f"fake core ({loaded.name} tokenizer)", device="none",
                      backend="none", weights="none", context=ctx,
                      pages=engine.allocator.num_pages, pool="fake", token_budget=0,
                      chunk_cap=None, max_queue=settings.max_queue, max_running=0,
                      attention="none")
    return engine, info
