"""Streaming detokenization with the tiny tokenizer, where token id b is exactly byte b.

That layout lets a test feed any byte sequence as ids, so the expectations come straight
from UTF-8 itself: a character appears once its last byte arrives, never earlier, and what
can never become a character is U+FFFD (as Python's own UTF-8 decoder reports it).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.model.detokenize import IncrementalDetokenizer, decode_all
from crucible.model.tokenizer import Tokenizer
from crucible.model.tiny_tokenizer import tiny_tokenizer


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return tiny_tokenizer()


def feed(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids]


def test_two_byte_character_waits_for_its_second_byte(tiny: Tokenizer) -> None:
    detok = tiny.detokenizer()
    assert detok.add(0xC3) == "" and detok.has_pending
    assert detok.add(0xA9) == "é" and not detok.has_pending
    assert detok.num_tokens == 2


def test_emoji_byte_by_byte(tiny: Tokenizer) -> None:
    data = "a😀b".encode()  # 61 F0 9F 98 80 62
    assert feed(tiny.detokenizer(), list(data)) == ["a", "", "", "", "😀", "b"]


def test_merged_tokens_and_specials(tiny: Tokenizer) -> None:
    ids = tiny.encode("<|im_start|> the string<|im_end|>")
    assert feed(tiny.detokenizer(), ids)[1] == " the"  # 258 is one token for four bytes
    assert "".join(feed(tiny.detokenizer(), ids)) == " the string"
    shown = tiny.detokenizer(skip_special_tokens=False)
    assert "".join(feed(shown, ids)) == "<|im_start|> the string<|im_end|>"


def test_flush_reports_an_unfinished_character(tiny: Tokenizer) -> None:
    detok = tiny.detokenizer()
    assert feed(detok, [0x68, 0x69, 0xE6, 0x97]) == ["h", "i", "", ""]  # first 2 of 日
    assert detok.flush() == "\ufffd"
    assert detok.flush() == "" and not detok.has_pending
    assert detok.add(0x41) == "A"  # usable after a flush


def test_invalid_bytes_do_not_stall_the_stream(tiny: Tokenizer) -> None:
    # 0xFF can never start a character; the stream shows U+FFFD and carries on.
    assert feed(tiny.detokenizer(), [0xFF, 0x41, 0xC3, 0x41]) == ["\ufffd", "A", "", "\ufffdA"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))))
def test_stream_of_encoded_text(tiny: Tokenizer, text: str) -> None:
    detok = tiny.detokenizer(skip_special_tokens=False)  # text may spell '<|im_end|>'
    pieces = feed(detok, tiny.encode(text)) + [detok.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces if "\ufffd" not in text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_stream_of_arbitrary_bytes(tiny: Tokenizer, data: bytes) -> None:
    detok = tiny.detokenizer()
    streamed = "".join(feed(detok, list(data))) + detok.flush()
    assert streamed == data.decode("utf-8", errors="replace")
    # The one-shot decode agrees with the stream, invalid bytes included.
    assert tiny.decode(list(data)) == streamed


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), max_size=60), st.booleans())
def test_decode_all_equals_streaming(ids: list[int], skip: bool) -> None:
    """One pass over all ids gives the streamed text: every add, then flush."""
    tiny = tiny_tokenizer()
    ids = [i % tiny.vocab_size for i in ids]
    detok = tiny.detokenizer(skip_special_tokens=skip)
    streamed = "".join(feed(detok, ids)) + detok.flush()
    assert decode_all(tiny, ids, skip) == streamed


def test_decode_all_negative_control(tiny: Tokenizer) -> None:
    """Decoding token by token (no carried state) is not the same: a split character breaks."""
    ids = list("é".encode())
    assert decode_all(tiny, ids) == "é"
    assert "".join(bytes([i]).decode("utf-8", errors="replace") for i in ids) != "é"


def test_kept_whole_texts_are_the_decoders(tiny: Tokenizer) -> None:
    """Each id's kept text (the streaming fast path) is what the decoder gives for its bytes
    from an empty state, '' for a skipped special, and None for bytes that are no whole
    characters; detokenizers of one tokenizer and mode share them."""
    from crucible.model.detokenize import whole_texts

    ids = tiny.encode("a é 😀 the<|im_end|>") + [0xFF, 0xC3]
    feed(tiny.detokenizer(), ids)
    kept = whole_texts(tiny)
    assert tiny.detokenizer().whole is kept and whole_texts(tiny, False) is not kept
    for i in ids:
        try:
            want = "" if tiny.is_special(i) else tiny.token_bytes(i).decode()
        except UnicodeDecodeError:
            want = None
        assert kept[i] == want, i
    assert kept[0xC3] is None and kept[0x61] == "a" and kept[258] == " the"


def test_a_tokenizer_without_weak_references_keeps_its_own_texts(tiny: Tokenizer) -> None:
    class Slotted:
        __slots__ = ()

        def token_bytes(self, token_id: int) -> bytes:
            return tiny.token_bytes(token_id)

        def is_special(self, token_id: int) -> bool:
            return tiny.is_special(token_id)

    detok = IncrementalDetokenizer(Slotted())
    assert feed(detok, list("é!".encode()) + [0x21, 0xC3, 0x21]) == ["", "é", "!", "!", "",
                                                                    "\ufffd!"]
    assert detok.whole[0x21] == "!" and IncrementalDetokenizer(Slotted()).whole == {}
