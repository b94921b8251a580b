"""A model whose embedding has more rows than its tokenizer has tokens (a vocabulary padded to
a round size, as many checkpoints ship) can sample the extra ids. They decode to no text,
in every detokenizing path, instead of failing the request; ids past the model's own
vocabulary are still refused."""

from __future__ import annotations

import pytest

from crucible.api import LLM
from crucible.engine import core_wire as wire
from crucible.engine.sampling import SamplingParams
from crucible.errors import RequestError
from crucible.model.detokenize import decode_all
from crucible.model.tiny import tiny_random_model
from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_tokenizer
from crucible.server.openai_common import completion_logprobs

PADDED = TINY_VOCAB_SIZE + 48


def test_padding_ids_decode_to_no_text_and_the_rest_is_refused() -> None:
    model = tiny_random_model(seed=3, vocab_size=PADDED)
    tok = model.tokenizer
    assert (tok.vocab_size, tok.model_vocab_size) == (TINY_VOCAB_SIZE, PADDED)
    pad = TINY_VOCAB_SIZE + 5
    assert tok.token_bytes(pad) == b"" and tok.decode([pad]) == ""
    assert tok.decode([5, pad, 5]) == tok.decode([5, 5])
    assert decode_all(tok, [5, pad, 5]) == decode_all(tok, [5, 5])
    stream = tok.detokenizer()
    assert "".join(stream.add(t) for t in (5, pad, 5)) + stream.flush() == tok.decode([5, 5])
    for bad in (PADDED, -1):
        with pytest.raises(RequestError, match=f"token id {bad} outside vocabulary of {PADDED}"):
            tok.decode([bad])
        with pytest.raises(RequestError, match="outside vocabulary"):
            tok.token_bytes(bad)
    lp = completion_logprobs(tok, [pad], [None], 0)
    assert lp["tokens"] == [""]


def test_the_front_tokenizer_knows_the_padding_too() -> None:
    """The engine process sends its tokenizer to the HTTP front, which detokenises there."""
    tok = tiny_random_model(seed=3, vocab_size=PADDED).tokenizer
    again = wire.tokenizer_from_payload(wire.decode_json(wire.encode_json(
        wire.READY, wire.tokenizer_payload(tok))))
    assert again.model_vocab_size == PADDED and again.token_bytes(PADDED - 1) == b""


def test_an_uncovered_tokenizer_refuses_the_padding_ids() -> None:
    """The negative control: without the model's vocabulary the same ids are errors."""
    tok = tiny_tokenizer()
    with pytest.raises(RequestError, match=f"outside vocabulary of {TINY_VOCAB_SIZE}"):
        tok.token_bytes(TINY_VOCAB_SIZE + 5)


def test_generation_that_samples_padding_ids_completes() -> None:
    llm = LLM(model=tiny_random_model(seed=3, vocab_size=PADDED))
    hot = SamplingParams(temperature=5.0, max_tokens=48, seed=1, ignore_eos=True)
    outs = llm.generate(["hello world"] * 4, hot)
    ids = [t for o in outs for t in o.token_ids]
    assert any(t >= TINY_VOCAB_SIZE for t in ids)  # the case under test really happens
    tok = llm.tokenizer
    for o in outs:
        assert len(o.token_ids) == 48
        assert o.text == tok.decode(o.token_ids, skip_special_tokens=True)
    alloc = llm.engine.allocator
    assert alloc.num_free == alloc.num_pages  # every page came back
