"""The tokenizer: text <-> token ids, chat prompts, stop tokens, streaming text.

One class wraps a ``tokenizers.Tokenizer`` whatever the model came from: a GGUF (built from
its metadata, see bpe_build.py), an HF directory (tokenizer.json), or the tiny in-memory
tokenizer of the tests. Invariants:
- ids are the model's ids: a GGUF's token i is id i, specials included;
- special tokens written in text parse as their ids (the chat template relies on it);
- BOS is added only when the model asks for it, and never twice;
- absent ids are ``None``, never -1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from crucible.errors import ConfigError, RequestError
from crucible.model.bpe_build import CHAR_TO_BYTE
from crucible.model.chat_template import CHATML_TEMPLATE, ChatTemplate
from crucible.model.detokenize import IncrementalDetokenizer

# Besides EOS, these end a chat turn or a document; generation stops on any present.
_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


class Tokenizer:
    """Encode/decode text for one model, render its chat template, name its stop tokens."""

    def __init__(self, backend: HFTokenizer, *, bos_token_id: int | None,
                 eos_token_id: int | None, add_bos: bool, chat_template: str | None,
                 extra_stop_ids: Sequence[int] = (), byte_level: bool = True,
                 source: str = "") -> None:
        self.backend = backend
        self.source = source  # file or directory it came from, for messages
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.model_vocab_size = self.vocab_size  # ids past vocab_size: cover()
        for name, tid in (("bos", bos_token_id), ("eos", eos_token_id)):
            if tid is not None and not 0 <= tid < self.vocab_size:
                raise ValueError(f"{name} token id {tid} outside vocabulary of {self.vocab_size}")
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = add_bos and bos_token_id is not None
        added = backend.get_added_tokens_decoder()
        self._added_ids = frozenset(added)
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self.byte_level = byte_level
        stops = {t for t in (eos_token_id, *extra_stop_ids) if t is not None}
        stops.update(i for i in map(self.token_to_id, _STOP_TOKENS) if i is not None)
        self.stop_token_ids: tuple[int, ...] = tuple(sorted(stops))
        self.has_chat_template = chat_template is not None
        self.chat_template = ChatTemplate(
            chat_template if chat_template is not None else CHATML_TEMPLATE,
            bos_token=self._token_str(bos_token_id), eos_token=self._token_str(eos_token_id))
        self._bytes: list[bytes] | None = None  # built on first streaming use

    # -- ids and text ---------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens in it parse as their ids.

        ``add_bos=None`` follows the model. A BOS already at the start (e.g. written by the
        chat template) is not doubled. Encoded through the batch call, which gives the same
        ids and releases the GIL while it runs (the single-text call holds it), so a long
        text encoded in a worker thread does not stall the event loop.
        """
        if not isinstance(text, str):
            raise RequestError(f"text to encode must be a string, got {type(text).__name__}")
        try:
            ids = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        except TypeError:  # a lone surrogate: argv or stdin bytes that are not UTF-8
            raise RequestError(_not_unicode(text)) from None
        want_bos = self.add_bos if add_bos is None else add_bos
        if want_bos:
            if self.bos_token_id is None:
                raise ConfigError(f"add_bos requested but the model has no BOS token "
                                  f"({self.source or 'tokenizer'})")
            if not ids or ids[0] != self.bos_token_id:
                ids.insert(0, self.bos_token_id)
        return ids

    def cover(self, model_vocab_size: int) -> None:
        """The model's ids run to ``model_vocab_size``: its embedding has rows past the last
        token (a vocabulary padded to a round size), which it can still sample. Those ids
        decode to no text, as vLLM's and HF's detokenizers give them."""
        self.model_vocab_size = max(self.vocab_size, int(model_vocab_size))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.model_vocab_size]
        if bad:
            raise RequestError(f"token id {bad[0]} outside vocabulary of "
                               f"{self.model_vocab_size}")
        if self.model_vocab_size > self.vocab_size:  # padding rows: no text
            ids = [i for i in ids if i < self.vocab_size]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of an id (byte-level form, e.g. 'Ġthe'); None if unknown."""
        return self.backend.id_to_token(int(token_id))

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (what ``skip_special_tokens`` drops)."""
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (special tokens: their text in UTF-8)."""
        if self._bytes is None:
            self._bytes = [self._compute_bytes(i) for i in range(self.vocab_size)]
        if not 0 <= token_id < self.model_vocab_size:
            raise RequestError(f"token id {token_id} outside vocabulary of "
                               f"{self.model_vocab_size}")
        return self._bytes[token_id] if token_id < self.vocab_size else b""

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer for one output sequence."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # -- chat -----------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **extra: Any) -> str:
        """Prompt text for a conversation, rendered with the model's own template.

        Uses the template shipped with the model (GGUF ``tokenizer.chat_template`` or
        tokenizer_config.json ``chat_template``); only when the model has none does it fall
        back to plain ChatML (see ``has_chat_template``). Bad messages (not a list, missing
        role/content, non-string content) raise RequestError before rendering.
        """
        return self.chat_template.render(messages, add_generation_prompt, **extra)

    def encode_chat(self, messages: list[dict[str, Any]],
                    add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    # -- helpers --------------------------------------------------------------------------

    def _token_str(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.id_to_token(token_id)

    def _compute_bytes(self, token_id: int) -> bytes:
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self._added_ids:
            return piece.encode("utf-8")
        if self.byte_level:
            # A stray non-byte-level character keeps its UTF-8, as the ByteLevel decoder does.
            return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode()
                            for c in piece)
        # Not byte-level (a SentencePiece-style vocabulary): '<0xNN>' byte-fallback tokens
        # and '▁' for a space; the decoder's first-space strip is not reproduced.
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={self.eos_token_id}, stops={self.stop_token_ids}, source={self.source!r})")


def _not_unicode(text: str) -> str:
    """Where ``text`` stops being encodable: Python decodes bytes that are not UTF-8 (in
    argv, stdin, file names) to lone surrogates, which the tokenizer cannot take."""
    for i, c in enumerate(text):
        if "\ud800" <= c <= "\udfff":
            what = f"byte 0x{ord(c) - 0xDC00:02x}" if c >= "\udc80" else f"U+{ord(c):04X}"
            return (f"text to encode is not valid UTF-8: {what} at character {i} (a lone "
                    "surrogate); re-encode the input as UTF-8")
    return "text to encode cannot be tokenized"
