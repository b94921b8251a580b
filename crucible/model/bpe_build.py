"""Build a byte-level BPE ``tokenizers.Tokenizer`` from a token list and ranked merges.

This is the part of GGUF tokenizer loading that does not depend on the file format: the
same function builds the real SmolLM2 tokenizer (from GGUF metadata) and the tiny test
tokenizer (from a literal vocabulary), so tests of the tiny one exercise the real pipeline.

Byte-level BPE (GPT-2 style) works on bytes, each written as one printable character: the
bytes that are already printable stand for themselves, the rest are moved to code points
256.. in byte order. A vocabulary token is a string of those characters; merges are ranked
pairs ("a b", rank = position in the list).

Pre-tokenization is named by the GGUF key ``tokenizer.ggml.pre`` (llama.cpp's names). For
``smollm`` llama.cpp first isolates every numeric character, then applies the GPT-2 split
regex to what lies between; SmolLM2's own tokenizer.json says the same thing as
``Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]``, which is
what we build.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

# GGUF token_type values (llama.cpp's llama_token_type).
TOKEN_UNDEFINED = 0
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6


def _bytes_to_chars() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    moved = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + moved)
            moved += 1
    return table


BYTE_TO_CHAR: dict[int, str] = _bytes_to_chars()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_CHAR.items()}

# llama3's split regex (pre = "llama-bpe"): letters with one leading non-letter, numbers in
# groups of up to three, newlines kept apart from other whitespace.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Pre-tokenizer names that share a rule; llama.cpp groups them the same way.
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell", "exaone", "minerva",
                     "command-r"}
_GPT2_ONLY = {"default", "gpt-2", "gpt2", "mpt", "olmo", "jais"}
_LLAMA3 = {"llama-bpe", "llama3"}
SUPPORTED_PRE = sorted(_DIGITS_THEN_GPT2 | _GPT2_ONLY | _LLAMA3)


def make_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp applies for ``tokenizer.ggml.pre == pre``."""
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in _GPT2_ONLY:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _LLAMA3:
        # The split happens on text; ByteLevel then only maps bytes (no second regex).
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    raise ValueError(f"unsupported pre-tokenizer {pre!r} (supported: {', '.join(SUPPORTED_PRE)})")


def build_byte_level_bpe(tokens: Sequence[str], merges: Sequence[str],
                         token_types: Sequence[int] | None, pre: str) -> HFTokenizer:
    """A ``tokenizers.Tokenizer`` whose id i is ``tokens[i]``.

    Control tokens (type 3) become special added tokens: they parse out of text and
    ``skip_special_tokens`` drops them. User-defined tokens (type 4) parse out of text too
    but decode as ordinary text. Raises ValueError on an inconsistent vocabulary.
    """
    if token_types is not None and len(token_types) != len(tokens):
        raise ValueError(f"{len(token_types)} token types for {len(tokens)} tokens")
    for i, kind in enumerate(token_types or ()):
        if not TOKEN_UNDEFINED <= kind <= TOKEN_BYTE:  # else a control token reads as text
            raise ValueError(f"token {i} ({tokens[i]!r}) has type {kind}; llama.cpp's token "
                             f"types are {TOKEN_UNDEFINED} to {TOKEN_BYTE}")
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            raise ValueError(f"token {tok!r} appears twice (ids {vocab[tok]} and {i})")
        vocab[tok] = i
    # A byte-level vocabulary has a token for every printable ASCII byte. It need not have
    # all 256: SmolLM2 lacks a few control bytes and bytes that never occur in UTF-8 (0xC0,
    # 0xF5..), and like llama.cpp we then drop such a byte from the input rather than fail.
    missing = [b for b in range(0x20, 0x7F) if BYTE_TO_CHAR[b] not in vocab]
    if missing:
        raise ValueError(f"vocabulary lacks the byte token for {chr(missing[0])!r}; "
                         "not a byte-level BPE vocabulary")
    pairs: list[tuple[str, str]] = []
    for rank, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        # Byte-level tokens never contain a literal space (it is written as 'Ġ').
        if not sep or not left or not right or " " in right:
            raise ValueError(f"merge {rank} is malformed: {merge!r}")
        pairs.append((left, right))

    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    tok.pre_tokenizer = make_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    added: list[AddedToken] = []
    for i, kind in enumerate(token_types or ()):
        if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            # normalized=False: match the exact text; no lstrip/rstrip so surrounding
            # whitespace stays with the neighbouring text, as llama.cpp does.
            added.append(AddedToken(tokens[i], special=kind == TOKEN_CONTROL,
                                    normalized=False, single_word=False))
    if added:
        tok.add_tokens(added)
    # Added tokens already in the vocabulary keep their ids; a new id would shift the model.
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError("special tokens are not all in the BPE vocabulary")
    return tok
