"""The embedded Python API: ``from crucible import LLM, SamplingParams``.

    llm = LLM()                                  # the default model, numpy backend, int8
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason   # "stop" | "length"

``generate`` runs the engine until every prompt is done; all prompts share packed steps.
For streaming, ``llm.async_engine()`` gives an AsyncLLMEngine over the same engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Union

from crucible.engine.async_engine import AsyncLLMEngine
from crucible.engine.engine import LLMEngine, RequestDelta
from crucible.engine.pages import pages_for
from crucible.engine.sampling import SamplingParams
from crucible.engine.scheduler import SchedulerConfig
from crucible.errors import ConfigError, QueueFullError

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


class LLM:
    def __init__(self, model: Any = None, *, device: str = "auto", weights: str | None = None,
                 token_budget: int = 1024, chunk_cap: int | None = None, max_queue: int = 64,
                 max_running: int = 256, num_pages: int | None = None, seed: int = 0) -> None:
        """``model``: a known name, a .gguf path, an HF directory, or a LoadedModel.

        ``weights``: "int8" (default when loading by name) or "f32"; a LoadedModel keeps
        the mode it was loaded with (asking for another one is an error).

        ``num_pages`` defaults to twice the pages of one full context (at least 64).
        ``seed`` is the base from which requests without their own seed derive one
        (see crucible.engine.rng): fresh LLMs given the same calls sample the same tokens.
        """
        from crucible.model.loader import load_model
        from crucible.model.runner import ModelRunner

        if model is None or isinstance(model, str):
            from crucible.model.fetch import DEFAULT_MODEL

            model = load_model(model or DEFAULT_MODEL, weights or "int8")
        elif weights is not None and weights != model.weights_mode:
            raise ConfigError(f"weights={weights!r} but the given model was loaded as "
                              f"{model.weights_mode!r}")
        self.model = model
        pages = num_pages if num_pages is not None else max(64, 2 * pages_for(model.config.max_context))
        runner = ModelRunner(model, num_pages=pages, device=device)
        config = SchedulerConfig(token_budget=token_budget, chunk_cap=chunk_cap,
                                 max_queue=max_queue, max_running=max_running)
        self.engine = LLMEngine(runner, model.tokenizer, config, seed=seed)

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    def async_engine(self) -> AsyncLLMEngine:
        return AsyncLLMEngine(self.engine)

    def _prompts(self, prompts: Prompt | Sequence[Prompt]) -> list[tuple[str | None, list[int]]]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # a single prompt (text or token ids)
        out = []
        for p in prompts:
            if isinstance(p, str):
                out.append((p, self.tokenizer.encode(p)))
            else:
                out.append((None, [int(t) for t in p]))
        return out

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion together; outputs come back in prompt order."""
        items = self._prompts(prompts)
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(plist) != len(items):
            raise ConfigError(f"{len(plist)} SamplingParams for {len(items)} prompts")
        plist = [p or SamplingParams() for p in plist]
        for (_, ids), p in zip(items, plist):  # reject bad requests before running any
            self.engine.check_request(ids, p)
        deltas: dict[str, list[RequestDelta]] = {}
        rids: list[str] = []
        next_item = 0
        while next_item < len(items) or any(r in self.engine.requests for r in rids):
            while next_item < len(items):  # the queue is bounded: feed it as it drains
                try:
                    rid = self.engine.add_request(items[next_item][1], plist[next_item])
                except QueueFullError:
                    if not self.engine.has_unfinished():
                        raise
                    break
                rids.append(rid)
                deltas[rid] = []
                next_item += 1
            for d in self.engine.step():
                if d.request_id in deltas:
                    deltas[d.request_id].append(d)
        return [self._collect(rid, prompt, ids, deltas[rid])
                for rid, (prompt, ids) in zip(rids, items)]

    def chat(self, messages: Sequence[dict] | Sequence[Sequence[dict]],
             params: SamplingParams | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts = [self.tokenizer.apply_chat_template(list(c), add_generation_prompt=True)
                 for c in convs]
        return self.generate(texts, params)

    @staticmethod
    def _collect(rid: str, prompt: str | None, ids: list[int],
                 deltas: list[RequestDelta]) -> RequestOutput:
        token_ids = tuple(t for d in deltas for t in d.new_token_ids)
        lps = [lp for d in deltas if d.new_logprobs is not None for lp in d.new_logprobs]
        has_lp = any(d.new_logprobs is not None for d in deltas)
        plp = next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None)
        return RequestOutput(rid, prompt, tuple(ids), "".join(d.new_text for d in deltas),
                             token_ids, deltas[-1].finish_reason if deltas else None,
                             tuple(lps) if has_lp else None, plp)
