"""The embedded Python API: ``from crucible import LLM, SamplingParams``.

    llm = LLM()                                  # the default model, int8, GPU when there is one
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason   # "stop" | "length"

``generate`` runs the engine until every prompt is done; all prompts share packed steps.
For streaming, ``llm.async_engine()`` gives an AsyncLLMEngine over the same engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Union

from crucible.engine.async_engine import AsyncLLMEngine
from crucible.engine.engine import RequestDelta
from crucible.engine.factory import build_engine
from crucible.engine.sizes import parse_bytes
from crucible.engine.sampling import SamplingParams
from crucible.engine.settings import Settings, given_cache_size
from crucible.errors import ConfigError, QueueFullError
from crucible.model.fetch import DEFAULT_MODEL
from crucible.model.detokenize import decode_all
from crucible.model.loader import LoadedModel

__all__ = ["LLM", "RequestOutput", "SamplingParams"]

Prompt = Union[str, Sequence[int]]


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: tuple[int, ...]
    text: str  # excludes a stop string and the text of a stop token
    token_ids: tuple[int, ...]  # every generated id, including a final stop token
    finish_reason: str | None  # "stop" | "length" ("abort" only through the async API)
    logprobs: tuple[dict[int, float], ...] | None  # per generated token: top-N + sampled
    prompt_logprobs: tuple[dict[int, float] | None, ...] | None  # entry 0 is None
    num_cached_tokens: int = 0  # prompt positions reused from the prefix cache


class LLM:
    def __init__(self, model: str | LoadedModel | None = None, *, device: str | None = None,
                 weights: str | None = None, token_budget: int | None = None,
                 chunk_cap: int | None = None, max_queue: int | None = None,
                 max_running: int | None = None, num_pages: int | None = None,
                 kv_cache_memory: int | str | None = None,
                 gpu_memory_fraction: float | None = None, seed: int | None = None,
                 prefix_cache_size: int | str | None = None,
                 prefix_cache_max_tokens: int | None = None,
                 prefix_cache_entries: int | None = None,
                 settings: Settings | None = None) -> None:
        """``model``: a known name, a .gguf path, an HF directory, or a LoadedModel.

        The keyword arguments override ``settings`` (default: the CRUCIBLE_* environment
        and the built-in defaults; see the README's settings table). ``kv_cache_memory``:
        bytes or a size such as "40GiB" (CUDA). ``weights``: "int8"
        (the default) or "f32"; a LoadedModel keeps the mode it was loaded with. ``seed`` is
        the base from which requests without their own seed derive one (engine/rng.py):
        fresh LLMs given the same calls sample the same tokens. ``prefix_cache_size``: the
        prefix cache's budget in bytes or as "3.5GiB" / "2GB" (0 or "0" turns it off;
        default: CRUCIBLE_PREFIX_CACHE_SIZE, else the pool); ``prefix_cache_max_tokens``
        and ``prefix_cache_entries``: its longest prefix and most chains.
        """
        if isinstance(model, LoadedModel) and weights is None:
            weights = model.weights_mode
        if isinstance(kv_cache_memory, str):
            kv_cache_memory = parse_bytes(kv_cache_memory)
        if isinstance(prefix_cache_size, str):
            prefix_cache_size = given_cache_size("prefix_cache_size", prefix_cache_size)
        given = dict(device=device, weights=weights, token_budget=token_budget,
                     chunk_cap=chunk_cap, max_queue=max_queue, max_running=max_running,
                     num_pages=num_pages, kv_cache_memory=kv_cache_memory,
                     gpu_memory_fraction=gpu_memory_fraction, seed=seed,
                     prefix_cache_size=prefix_cache_size,
                     prefix_cache_max_tokens=prefix_cache_max_tokens,
                     prefix_cache_entries=prefix_cache_entries)
        if settings is None:
            settings = Settings.from_env(**given)
        else:
            settings = settings.replace(**{k: v for k, v in given.items() if v is not None})
        self.settings = settings
        self._async: AsyncLLMEngine | None = None
        self.engine, self.info = build_engine(model or DEFAULT_MODEL, settings)
        self.model = self.engine.runner.model

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    def async_engine(self) -> AsyncLLMEngine:
        """The streaming front of this LLM's engine: always the same one, since two would
        both step the engine from their own threads. Do not call ``generate`` while it is
        serving requests."""
        if self._async is None:
            self._async = AsyncLLMEngine(self.engine)
        return self._async

    def _prompts(self, prompts: Prompt | Sequence[Prompt]
                 ) -> list[tuple[str | None, Sequence[int]]]:
        """(text or None, ids) a prompt; ids as given (``generate`` checks and converts)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # a single prompt (text or token ids)
        return [(p, self.tokenizer.encode(p)) if isinstance(p, str) else (None, p)
                for p in prompts]

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion together; outputs come back in prompt order."""
        items = self._prompts(prompts)
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(plist) != len(items):
            raise ConfigError(f"{len(plist)} SamplingParams for {len(items)} prompts")
        plist = [p or SamplingParams() for p in plist]
        # Reject bad requests before running any; the ids as the engine keeps them.
        items = [(text, self.engine.checked_ids(ids, p)) for (text, ids), p in zip(items, plist)]
        deltas: dict[str, list[RequestDelta]] = {}
        rids: list[str] = []
        next_item = 0
        live = 0  # added and not finished
        while next_item < len(items) or live:
            while next_item < len(items):  # the queue is bounded: feed it as it drains
                try:
                    # One delta per request, at its end; text decoded once (_collect).
                    rid = self.engine.add_request(items[next_item][1], plist[next_item],
                                                  final_only=True, checked=True)
                except QueueFullError:
                    if not self.engine.has_unfinished():
                        raise
                    break
                rids.append(rid)
                deltas[rid] = []
                next_item += 1
                live += 1
            for d in self.engine.step():
                if d.request_id in deltas:
                    deltas[d.request_id].append(d)
                    live -= d.finished
        return [self._collect(rid, prompt, ids, deltas[rid], p)
                for rid, (prompt, ids), p in zip(rids, items, plist)]

    def chat(self, messages: Sequence[dict] | Sequence[Sequence[dict]],
             params: SamplingParams | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts = [self.tokenizer.apply_chat_template(list(c), add_generation_prompt=True)
                 for c in convs]
        return self.generate(texts, params)

    def _collect(self, rid: str, prompt: str | None, ids: list[int],
                 deltas: list[RequestDelta], params: SamplingParams) -> RequestOutput:
        token_ids = tuple(t for d in deltas for t in d.new_token_ids)
        reason = deltas[-1].finish_reason if deltas else None
        if params.stop:  # stop strings: the engine streamed the text
            text = "".join(d.new_text for d in deltas)
        else:  # a stop id ends the output and its text is never shown
            shown = token_ids[:-1] if reason == "stop" else token_ids
            text = decode_all(self.tokenizer, list(shown))
        lps = [lp for d in deltas if d.new_logprobs is not None for lp in d.new_logprobs]
        has_lp = any(d.new_logprobs is not None for d in deltas)
        plp = next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None)
        cached = deltas[-1].num_cached_tokens if deltas else 0
        return RequestOutput(rid, prompt, tuple(ids), text, token_ids, reason,
                             tuple(lps) if has_lp else None, plp, cached)
