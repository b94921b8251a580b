"""A tiny byte-level BPE tokenizer for tests with small random models (no download).

It goes through the same builder as the real GGUF tokenizer (bpe_build.py) with the same
``smollm`` pre-tokenizer, so it behaves like SmolLM2's tokenizer at a smaller scale.

Ids (vocab_size = TINY_VOCAB_SIZE = 272):
- 0..255: one token per byte; id == byte value (b"A" -> 65, b" " -> 32, b"\\n" -> 10).
- 256..268: merges, in rank order (TINY_MERGES below), e.g. " the" -> 258, "in" -> 259.
- 269 <|endoftext|>, 270 <|im_start|> (BOS, not added by default), 271 <|im_end|> (EOS).
  All three are control tokens; stop_token_ids = (269, 271).
No chat template is stored, so apply_chat_template uses the built-in ChatML fallback,
which is what SmolLM2's own template produces when a system message is given.
"""

from __future__ import annotations


from crucible.model.bpe_build import BYTE_TO_CHAR, TOKEN_CONTROL, TOKEN_NORMAL, build_byte_level_bpe
from crucible.model.tokenizer import Tokenizer


# (left, right) in byte-level spelling; 'Ġ' is the space byte, 'Ċ' the newline byte.
TINY_MERGES: tuple[tuple[str, str], ...] = (
    ("Ġ", "t"),      # 256 "Ġt"
    ("h", "e"),      # 257 "he"
    ("Ġt", "he"),    # 258 "Ġthe"
    ("i", "n"),      # 259 "in"
    ("Ġ", "a"),      # 260 "Ġa"
    ("e", "r"),      # 261 "er"
    ("o", "n"),      # 262 "on"
    ("Ġ", "Ġ"),      # 263 "ĠĠ"
    ("ĠĠ", "ĠĠ"),    # 264 "ĠĠĠĠ"
    ("in", "g"),     # 265 "ing"
    ("r", "e"),      # 266 "re"
    ("2", "0"),      # 267 "20": never applies, since digits are split first (a check)
    ("Ċ", "Ċ"),      # 268 "ĊĊ"
)
TINY_SPECIALS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_FIRST_MERGE_ID = 256
TINY_ENDOFTEXT_ID = 269
TINY_BOS_ID = 270  # <|im_start|>
TINY_EOS_ID = 271  # <|im_end|>
TINY_VOCAB_SIZE = 272


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges as 'a b' strings, token types) in GGUF layout."""
    tokens = [BYTE_TO_CHAR[b] for b in range(256)]
    tokens += [left + right for left, right in TINY_MERGES]
    tokens += list(TINY_SPECIALS)
    types = [TOKEN_NORMAL] * (len(tokens) - len(TINY_SPECIALS))
    types += [TOKEN_CONTROL] * len(TINY_SPECIALS)
    merges = [f"{left} {right}" for left, right in TINY_MERGES]
    assert len(tokens) == TINY_VOCAB_SIZE
    return tokens, merges, types


def tiny_tokenizer() -> Tokenizer:
    """A fresh tiny Tokenizer (cheap: a few milliseconds)."""

    tokens, merges, types = tiny_vocab()
    backend = build_byte_level_bpe(tokens, merges, types, pre="smollm")
    return Tokenizer(backend, bos_token_id=TINY_BOS_ID, eos_token_id=TINY_EOS_ID,
                     add_bos=False, chat_template=None, byte_level=True, source="tiny")
