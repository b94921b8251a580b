"""Streaming detokenization: token ids in, only the new text out, never half a character.

Byte-level BPE tokens are byte strings, and one character (an emoji, a CJK ideograph) is
often split across two or three tokens. Decoding token by token would print replacement
characters; decoding the whole prefix each step is quadratic. Instead we keep the raw bytes
of each token and push them through an incremental UTF-8 decoder, which returns every
complete character at once and holds an incomplete tail until the next token (or
``flush()``) arrives. Bytes that can never form a character become U+FFFD, as in
``Tokenizer.decode``.

Most tokens are whole characters, and most of the time nothing is held back. Then a
token's text is the same string every time, so it is decoded once per tokenizer and kept
(``whole_texts``): the common step is one dict lookup, and the decoder runs only around
split characters.
"""

from __future__ import annotations

import codecs
import weakref
from typing import Protocol


class TokenBytes(Protocol):
    """What the detokenizer needs from a tokenizer."""

    def token_bytes(self, token_id: int) -> bytes: ...

    def is_special(self, token_id: int) -> bool: ...


class IncrementalDetokenizer:
    """Feed ids one at a time; get back the text they complete.

    ``skip_special_tokens`` defaults to True because a stream shown to a user should not
    carry control tokens such as ``<|im_end|>``; pass False to see them verbatim.
    The concatenation of every ``add`` result and ``flush()`` equals
    ``tokenizer.decode(all_ids, skip_special_tokens)`` for byte-level vocabularies.
    """

    __slots__ = ("_tok", "_skip_special", "_decoder", "num_tokens", "_pending", "whole")

    def __init__(self, tokenizer: TokenBytes, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.num_tokens = 0
        self._pending = 0  # bytes held back inside the decoder (an incomplete character)
        # Shared by every detokenizer of this tokenizer and mode: id -> its whole text.
        self.whole = whole_texts(tokenizer, skip_special_tokens)

    def add(self, token_id: int) -> str:
        """The text completed by ``token_id`` ('' while a character is still partial)."""
        self.num_tokens += 1
        if not self._pending:
            # Whole characters from an empty decoder come out as they are and leave it
            # empty, so the kept text is exactly what decoding would give.
            text = self.whole.get(token_id)
            if text is not None:
                return text
        return self._decode(token_id)

    def _decode(self, token_id: int) -> str:
        if self._skip_special and self._tok.is_special(token_id):
            self.whole[token_id] = ""  # never reaches the decoder, pending bytes or not
            return ""
        data = self._tok.token_bytes(token_id)
        if token_id not in self.whole:
            self.whole[token_id] = _whole_text(data)
        text = self._decoder.decode(data, final=False)
        self._pending = len(self._decoder.getstate()[0])
        return text

    @property
    def has_pending(self) -> bool:
        """True while bytes of an unfinished character are held back."""
        return self._pending > 0

    def flush(self) -> str:
        """End of stream: emit what is held back (an unfinished character becomes U+FFFD)."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        self._pending = 0
        return text


def decode_all(tokenizer: TokenBytes, ids: list[int], skip_special_tokens: bool = True) -> str:
    """The text an ``IncrementalDetokenizer`` gives for ``ids`` (every ``add``, then
    ``flush``), in one pass: UTF-8 decoding with replacement is the same whether the bytes
    arrive at once or in pieces."""
    skip = tokenizer.is_special if skip_special_tokens else (lambda _: False)
    data = b"".join(tokenizer.token_bytes(t) for t in ids if not skip(t))
    return data.decode("utf-8", errors="replace")


# tokenizer -> (texts with specials shown, texts with specials skipped); weak, so a
# tokenizer that is dropped takes its texts with it.
_WHOLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def whole_texts(tokenizer: TokenBytes, skip_special_tokens: bool = True
                ) -> dict[int, str | None]:
    """Token id -> its text when its bytes are whole UTF-8 characters ('' for a skipped
    special token), None when they split or break a character (those always go through
    the decoder); ids not seen yet are missing. One dict per tokenizer and mode, filled by
    the detokenizers as they meet ids (concurrent fills write the same value)."""
    try:
        per = _WHOLE.get(tokenizer)
        if per is None:
            per = _WHOLE[tokenizer] = ({}, {})
    except TypeError:  # a tokenizer that takes no weak reference: a dict of its own
        return {}
    return per[bool(skip_special_tokens)]


def _whole_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
