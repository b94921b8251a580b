"""The tiny test tokenizer, the HF-directory loader and GGUF metadata loading (no download).

Expected ids come from the documented layout of the tiny vocabulary (byte b -> id b, merge
k -> id 256 + k, specials 269..271) worked by hand through its merge ranks, or from a
tokenizer.json written here in the HF format and a GGUF written here with gguf.GGUFWriter.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.errors import ConfigError, ModelLoadError, RequestError
from crucible.model.tiny_tokenizer import TINY_MERGES, TINY_SPECIALS, tiny_tokenizer, tiny_vocab
from crucible.model.tokenizer import Tokenizer
from crucible.model.tokenizer_load import load_gguf_tokenizer, load_hf_tokenizer


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return tiny_tokenizer()


# (text, ids, why). Merge ranks: Ġt=0 he=1 Ġthe=2 in=3 Ġa=4 er=5 on=6 ĠĠ=7 ĠĠĠĠ=8 ing=9
# re=10 20=11 ĊĊ=12; id = 256 + rank.
HAND_WORKED = [
    ("A", [65], "a lone byte is its own id"),
    (" the", [258], "Ġ t -> Ġt (rank 0), h e -> he (rank 1), Ġt he -> Ġthe (rank 2)"),
    ("the", [116, 257], "no leading space: only h e merges; t stays byte 116"),
    ("string", [115, 116, 114, 265], "in (3) then in g (9); s, t, r stay bytes"),
    ("there", [116, 257, 266], "h e (1) before r e (10); e is taken, so r e merges after"),
    ("123", [49, 50, 51], "digits are split one by one before BPE"),
    ("2024", [50, 48, 50, 52], "the merge 2 0 exists but digits never share a BPE word"),
    ("a  b", [97, 32, 32, 98], "two spaces: the run keeps one, the other joins ' b'; no Ġb merge"),
    ("x     y", [120, 264, 32, 121], "five spaces: run of four -> ĠĠĠĠ (ranks 7, 8), ' y' separate"),
    ("\n\n", [268], "Ċ Ċ (rank 12)"),
    ("é", [0xC3, 0xA9], "two UTF-8 bytes, no merges"),
    ("<|im_start|>user<|im_end|>", [270, 117, 115, 261, 271], "specials parse; u s er"),
]


@pytest.mark.parametrize("text,ids,why", HAND_WORKED, ids=[w[0] for w in HAND_WORKED])
def test_hand_worked_ids(tiny: Tokenizer, text: str, ids: list[int], why: str) -> None:
    assert tiny.encode(text) == ids, why
    assert tiny.decode(ids) == text


def test_layout_matches_docstring(tiny: Tokenizer) -> None:
    assert tiny.vocab_size == 272
    assert [tiny.token_to_id(s) for s in TINY_SPECIALS] == [269, 270, 271]
    assert (tiny.bos_token_id, tiny.eos_token_id) == (270, 271)
    assert tiny.stop_token_ids == (269, 271)
    for rank, (left, right) in enumerate(TINY_MERGES):
        assert tiny.token_to_id(left + right) == 256 + rank
    assert all(tiny.token_bytes(b) == bytes([b]) for b in range(256))
    assert tiny.token_to_id("no such token") is None
    assert tiny.id_to_token(32) == "Ġ" and tiny.id_to_token(99999) is None


def test_bos_only_when_asked(tiny: Tokenizer) -> None:
    assert tiny.encode("hi") == [104, 105]  # the tiny model does not ask for BOS
    assert tiny.encode("hi", add_bos=True) == [270, 104, 105]
    assert tiny.encode("<|im_start|>hi", add_bos=True) == [270, 104, 105]  # not doubled
    no_bos = Tokenizer(tiny.backend, bos_token_id=None, eos_token_id=None, add_bos=True,
                       chat_template=None)
    assert no_bos.bos_token_id is None and no_bos.stop_token_ids == (269, 271)
    assert no_bos.encode("hi") == [104, 105]
    with pytest.raises(ConfigError):
        no_bos.encode("hi", add_bos=True)


def test_skip_special_and_bad_ids(tiny: Tokenizer) -> None:
    ids = tiny.encode("<|im_start|>a<|im_end|><|endoftext|>")
    assert ids == [270, 97, 271, 269]
    assert tiny.decode(ids, skip_special_tokens=True) == "a"
    assert tiny.is_special(271) and not tiny.is_special(97)
    with pytest.raises(RequestError):
        tiny.decode([272])
    with pytest.raises(RequestError):
        tiny.encode(b"bytes")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))))
def test_round_trip_any_text(tiny: Tokenizer, text: str) -> None:
    ids = tiny.encode(text)
    assert tiny.decode(ids) == text
    # Only specials and merges may shorten the text; otherwise one id per UTF-8 byte.
    assert len(ids) <= len(text.encode())


def _write_hf_dir(tmp: Path, config: dict | None) -> Path:
    """An HF tokenizer.json written by hand in the shape SmolLM2 ships (Digits + ByteLevel)."""
    tokens, merges, _ = tiny_vocab()
    data = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [{"id": 269 + i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in enumerate(TINY_SPECIALS)],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ") for m in merges]},
    }
    (tmp / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    if config is not None:
        (tmp / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp


SAMPLES = ["Hello world", "the string there", "x     y\n\n\tz", "2024-01-31", "héllo 日本 😀",
           "<|im_start|>user\nhi<|im_end|>\n"]


def test_hf_dir_matches_tiny(tiny: Tokenizer, tmp_path: Path) -> None:
    cfg = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
           "chat_template": "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
                            "{% endfor %}{{ eos_token }}"}
    tok = load_hf_tokenizer(_write_hf_dir(tmp_path, cfg))
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id) == (272, 270, 271)
    assert tok.add_bos is False  # no flag and the post-processor adds nothing
    for text in SAMPLES:
        assert tok.encode(text) == tiny.encode(text), text
    assert tok.has_chat_template
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x<|im_end|>"
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [271, 65]}')
    assert load_hf_tokenizer(tmp_path).stop_token_ids == (65, 269, 271)


def test_hf_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_hf_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_hf_tokenizer(tmp_path)
    _write_hf_dir(tmp_path, {"eos_token": "<|nope|>"})
    with pytest.raises(ModelLoadError, match="nope"):
        load_hf_tokenizer(tmp_path)
    _write_hf_dir(tmp_path, {"chat_template": "{% for %}"})
    with pytest.raises(ModelLoadError, match="chat template"):
        load_hf_tokenizer(tmp_path)


def _write_gguf(path: Path, skip: str = "", **override: object) -> Path:
    tokens, merges, types = tiny_vocab()
    kv = {"model": "gpt2", "tokens": tokens, "merges": merges, "types": types,
          "pre": "smollm", **override}
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(kv["model"])
    if skip != "tokens":
        w.add_token_list(kv["tokens"])
    if skip != "merges":
        w.add_token_merges(kv["merges"])
    w.add_token_types(kv["types"])
    w.add_tokenizer_pre(kv["pre"])
    w.add_bos_token_id(270)
    w.add_eos_token_id(kv.get("eos", 271))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_from_gguf_metadata(tiny: Tokenizer, tmp_path: Path) -> None:
    tok = load_gguf_tokenizer(_write_gguf(tmp_path / "t.gguf"))
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id) == (272, 270, 271)
    assert not tok.has_chat_template  # none stored: ChatML fallback
    for text in SAMPLES:
        assert tok.encode(text) == tiny.encode(text), text


@pytest.mark.parametrize("kwargs,needle", [
    ({"model": "llama"}, "'llama' is not supported"),
    ({"skip": "merges"}, "tokenizer.ggml.merges"),
    ({"skip": "tokens"}, "tokenizer.ggml.tokens"),
    ({"pre": "mystery"}, "mystery"),
    ({"eos": 5000}, "eos_token_id"),
    ({"merges": ["Ġt"]}, "malformed"),
    ({"types": [1] * 5}, "token types"),
])
def test_from_gguf_errors(tmp_path: Path, kwargs: dict, needle: str) -> None:
    path = _write_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(ModelLoadError, match=needle) as info:
        load_gguf_tokenizer(path)
    assert str(path) in str(info.value)


def test_from_gguf_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such"):
        load_gguf_tokenizer(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 7)
    with pytest.raises(ModelLoadError, match="junk.gguf"):
        load_gguf_tokenizer(junk)
