"""The throughput bench's workloads (bench/throughput.py): request lengths, prompts and
params.

Workloads (``--workload``; ``--requests``, ``--seed`` and the four length bounds override):

* ``random`` (default): vLLM's offline throughput benchmark. N=1,000 requests of random
  token ids, prompt lengths uniform in 64..1023, output lengths uniform in 128..511,
  exactly that many generated (``ignore_eos``), all given to ``LLM.generate`` at once.
* ``chat``: a chat-like mix. Prompt lengths lognormal with median 300 tokens and sigma 1.0
  (about 95% within 42..2,100), clipped to 20..2,000; output lengths lognormal with median
  150 and sigma 0.8 (about 95% within 31..720), clipped to 16..512. Why: chat prompts
  carry a system prompt and the conversation so far, so they are mostly a few hundred
  tokens with a long tail of long histories, and replies are mostly one to a few
  paragraphs, rarely past 500 tokens. The medians sit between single-turn chat logs
  (LMSYS-Chat-1M: user turns of tens of tokens, replies of a couple of hundred) and
  production conversation traces that include the history (prompts around a thousand
  tokens, replies around 130); a lognormal gives both the bulk and the tail. Output
  lengths are drawn independently of prompt lengths.

Both mixes are clipped to the model's context: an output is cut to context - 1 tokens,
then the prompt to context - output (a chat client drops old history first), so every
request generates exactly its drawn output length. Prompt ids are uniform over the
vocabulary minus the tokenizer's stop ids. Sampling is vLLM's: temperature 1.0, top-p 1.0
(``--temperature 0`` for greedy).
"""

from __future__ import annotations

import math
import random

from crucible import SamplingParams

WARMUP_REQUESTS = 8
# name -> (prompt min, max, output min, max); chat adds the lognormal medians and sigmas.
MIXES = {"random": (64, 1023, 128, 511), "chat": (20, 2000, 16, 512)}
CHAT_SHAPE = {"prompt_median": 300, "prompt_sigma": 1.0,
              "output_median": 150, "output_sigma": 0.8}


def lengths(kind: str, n: int, bounds: tuple[int, int, int, int], context: int,
            rng: random.Random) -> tuple[list[tuple[int, int]], int]:
    """(prompt length, output length) per request, and how many the context clipped."""
    pmin, pmax, omin, omax = bounds
    out, clipped = [], 0
    for _ in range(n):
        if kind == "random":
            p, o = rng.randint(pmin, pmax), rng.randint(omin, omax)
        else:
            p = round(rng.lognormvariate(math.log(CHAT_SHAPE["prompt_median"]),
                                         CHAT_SHAPE["prompt_sigma"]))
            o = round(rng.lognormvariate(math.log(CHAT_SHAPE["output_median"]),
                                         CHAT_SHAPE["output_sigma"]))
            p, o = min(max(p, pmin), pmax), min(max(o, omin), omax)
        o2 = min(o, context - 1)
        p2 = min(p, context - o2)
        clipped += (p2, o2) != (p, o)
        out.append((p2, o2))
    return out, clipped


def prompts_for(sizes: list[tuple[int, int]], ids: list[int], rng: random.Random
                ) -> list[list[int]]:
    return [[rng.choice(ids) for _ in range(p)] for p, _ in sizes]


def requests(kind: str, n: int, bounds: tuple[int, int, int, int], context: int,
             ids: list[int], rng: random.Random, temperature: float
             ) -> tuple[list[tuple[int, int]], int, list[list[int]], list[SamplingParams]]:
    """A workload of ``n`` requests: their (prompt, output) lengths, how many the context
    clipped, the prompts (ids drawn from ``ids``) and vLLM's params (``ignore_eos``)."""
    sizes, clipped = lengths(kind, n, bounds, context, rng)
    prompts = prompts_for(sizes, ids, rng)
    params = [SamplingParams(max_tokens=o, temperature=temperature, ignore_eos=True)
              for _, o in sizes]
    return sizes, clipped, prompts, params
