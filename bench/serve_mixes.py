"""Request mixes for bench/serve_clients.py: what each client sends, one body after another.

* ``issue`` (default): the client of issue #16 item 3. Text prompts of 20-600 random words,
  ``max_tokens`` 64-255, ``ignore_eos``, temperature 0.7.
* ``short``: the bench's first mix. 20-200 words, ``max_tokens`` 32-96, the same sampling.
* ``chat``: bench/throughput_workload.py's chat mix. Prompt and output lengths are lognormal
  and clipped to the context by ``throughput_workload.lengths``. The prompt is that many
  token ids, drawn by ``prompts_for`` over the vocabulary minus the stop ids. serve_load.py
  sends them as a list holding one id list. ``max_tokens`` is the drawn output length,
  with ``ignore_eos`` and temperature 0.7.
  That is the HTTP client's temperature; throughput.py's 1.0 would change nothing here,
  because the lengths are fixed.

Every client draws from its own ``random.Random(key)``. The same key always gives the same
bodies, so the engine-side batch-1 run (serve_batch1.py) can rebuild the 1-client level's
requests from the key alone, with no list passed around. The word mixes only send prompts
that fit the context. A tokenizer that makes many tokens per word (the tiny test model's byte
BPE: about 4.7) gets a lower word cap from ``fit_words``, and the JSON records it.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput_workload import MIXES as THROUGHPUT_MIXES  # noqa: E402
from throughput_workload import CHAT_SHAPE, lengths, prompts_for  # noqa: E402

WORDS = ("the cat sat on a mat while seven quick foxes ran past old river stones under "
         "grey autumn skies and nobody noticed").split()
TEMPERATURE = 0.7
# name -> (words min, max, max_tokens min, max) for the text mixes.
WORD_MIXES = {"issue": (20, 600, 64, 255), "short": (20, 200, 32, 96)}
MIX_NAMES = ("issue", "short", "chat")
# Headroom over the sampled tokens/word when capping words to the context: random word
# orders merge differently, and a prompt that does not fit would be a 400, not a figure.
WORD_MARGIN = 1.15


@dataclass(frozen=True)
class Served:
    """What a mix needs from the served model (read from /tokenizer_info and /tokenize)."""

    context: int
    vocab_size: int
    stop_ids: tuple[int, ...]
    tokens_per_word: float = 1.0
    _ids: list[int] = field(default_factory=list, compare=False, repr=False)

    def ids(self) -> list[int]:
        """Prompt ids for the chat mix: the vocabulary minus the stop ids (throughput.py's)."""
        if not self._ids:
            stops = set(self.stop_ids)
            self._ids.extend(t for t in range(self.vocab_size) if t not in stops)
        return self._ids


def fit_words(mix: str, served: Served) -> tuple[int, int, int, int]:
    """The word mix's bounds with the word cap lowered until the longest prompt, plus the
    largest ``max_tokens`` and a BOS, fits the served context."""
    wmin, wmax, omin, omax = WORD_MIXES[mix]
    room = served.context - omax - 1
    cap = int(room / (served.tokens_per_word * WORD_MARGIN))
    return wmin, max(wmin, min(wmax, cap)), omin, omax


def describe(mix: str, served: Served) -> dict[str, Any]:
    """The mix as the JSON records it, with any change the context forced."""
    if mix == "chat":
        pmin, pmax, omin, omax = THROUGHPUT_MIXES["chat"]
        return {"prompt": "token ids", "prompt_tokens": [pmin, pmax], "max_tokens": [omin, omax],
                "shape": CHAT_SHAPE, "clipped_to_context": served.context,
                "temperature": TEMPERATURE, "ignore_eos": True}
    wmin, wmax, omin, omax = fit_words(mix, served)
    return {"prompt": "text", "words": [wmin, wmax], "words_asked": list(WORD_MIXES[mix][:2]),
            "max_tokens": [omin, omax], "tokens_per_word": round(served.tokens_per_word, 3),
            "temperature": TEMPERATURE, "ignore_eos": True}


def bodies(mix: str, key: str, served: Served) -> Iterator[dict[str, Any]]:
    """The endless sequence of /v1/completions bodies (without model or stream fields) that
    one client with this key sends."""
    rng = random.Random(key)
    if mix == "chat":
        bounds = THROUGHPUT_MIXES["chat"]
        while True:
            sizes, _ = lengths("chat", 1, bounds, served.context, rng)
            ids = prompts_for(sizes, served.ids(), rng)[0]
            yield {"prompt": ids, "max_tokens": sizes[0][1], "temperature": TEMPERATURE,
                   "ignore_eos": True}
    wmin, wmax, omin, omax = fit_words(mix, served)
    while True:
        words = rng.choices(WORDS, k=rng.randint(wmin, wmax))
        yield {"prompt": " ".join(words), "max_tokens": rng.randint(omin, omax),
               "temperature": TEMPERATURE, "ignore_eos": True}


def level_key(mix: str, clients: int, client: int) -> str:
    """A measured client's key. It does not depend on the round or the engine mode, so both
    modes and every round send the same requests."""
    return f"serve-clients:{mix}:{clients}:{client}"


def warmup_key(mix: str, phase: int, client: int) -> str:
    return f"serve-clients-warmup:{mix}:{phase}:{client}"


def sample_text(n_words: int = 600) -> str:
    """A text for measuring the tokenizer's tokens per word (the longest the mix sends)."""
    return " ".join(random.Random("serve-clients:sample").choices(WORDS, k=n_words))
