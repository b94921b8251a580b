"""Hostile GGUF files: a bad header, metadata of the wrong type or value, bad tensors.

Each is one ModelLoadError naming the file and the key or tensor, never a traceback, a
hang or a huge allocation. Files are small synthetic ones (the tiny random model written
by tests/gguf_writer.py with single entries replaced), not the real model.
"""

from __future__ import annotations

import signal
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as T

from crucible.errors import ModelLoadError
from crucible.model.loader import load_model
from crucible.model.tiny import tiny_random_model
from gguf_writer import save_gguf

L = "llama."
TOK = "tokenizer.ggml."
MODEL = tiny_random_model(seed=1)


def load(path: Path) -> None:
    # A broken reader loop would hang the suite: SIGALRM turns that into a failure.
    def stuck(*_: object) -> None:
        raise TimeoutError("the load hung")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        load_model(str(path), "f32", use_prepared=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def header(*kv: bytes, tensors: tuple[bytes, ...] = ()) -> bytes:
    """A version-3 GGUF of these key/value entries, then these tensor descriptions."""
    return (b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv)
            + b"".join(tensors))


def key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.parametrize("data, message", [
    (b"", "it is empty"),
    (b"GG", "the GGUF magic needs 4 bytes"),
    (b"GGML" + bytes(40), "magic b'GGML' is not b'GGUF'"),
    (b"GGUF" + struct.pack("<IQQ", 99, 0, 0), "version 99 is not supported"),
    (b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0), "the name of tensor 0"),
    (header(key("k") + struct.pack("<IQ", 8, 2**60)), "the value of 'k' needs"),
    # An array of 2**60 uint8 past the end: the gguf reader looped on empty items forever
    # while its list of parts grew without bound.
    (header(key("k") + struct.pack("<IIQ", 9, 0, 2**60) + bytes(64)),
     "items of 'k' needs 1,152,921,504,606,846,976 bytes"),
    (header(key("k") + struct.pack("<IIQ", 9, 8, 2**40)), "declares 1,099,511,627,776 items"),
    (header(key("k") + struct.pack("<IIQ", 9, 9, 2**40)), "declares 1,099,511,627,776 items"),
    (header(key("k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 200),
     "nests arrays more than 8 deep"),
    (header(key("k") + struct.pack("<I", 77)), "'k' has unknown value type 77"),
    (header(key("k") + struct.pack("<IIQ", 9, 77, 1)), "'k' has items of unknown type 77"),
    (header(key("general.alignment") + struct.pack("<II", 4, 3)), "alignment = 3"),
    (header(tensors=(key("t") + struct.pack("<I", 9) + struct.pack("<Q", 2**40) * 9,)),
     "tensor 't' has 9 dimensions"),
    # 2**64 f32 values declared in a 100-byte file (np.prod of the dims wraps to 0).
    (header(tensors=(key("t") + struct.pack("<IQQIQ", 2, 2**32, 2**32, 0, 0),)),
     "tensor 't' of shape [4294967296, 4294967296] ends at byte"),
    (header(tensors=(key("t") + struct.pack("<IQIQ", 1, 4, 99, 0),)),
     "tensor 't' has unknown type 99"),
])
def test_bad_header(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match="bad.gguf: not a readable GGUF file") as exc:
        load(path)
    assert message in str(exc.value)


@pytest.mark.parametrize("meta, message", [
    ({L + "embedding_length": ("64", T.STRING)}, "llama.embedding_length must be a whole "
                                                 "number, got '64'"),
    ({L + "embedding_length": (64.5, T.FLOAT32)}, "llama.embedding_length must be a whole"),
    ({L + "block_count": ([2, 2], T.ARRAY)}, "llama.block_count must be a whole number"),
    ({L + "feed_forward_length": (True, T.BOOL)}, "llama.feed_forward_length must be a whole"),
    ({L + "vocab_size": ("x", T.STRING)}, "llama.vocab_size must be a whole number"),
    ({L + "rope.freq_base": ("abc", T.STRING)}, "llama.rope.freq_base must be a finite"),
    ({L + "attention.layer_norm_rms_epsilon": (float("inf"), T.FLOAT32)},
     "layer_norm_rms_epsilon must be a finite number, got inf"),
    ({L + "attention.head_count": (-4, T.INT32)}, "n_heads must be positive, got -4"),
    ({L + "attention.head_count": (3, T.UINT32), L + "attention.head_count_kv": (3, T.UINT32),
      L + "rope.dimension_count": None}, "embedding_length=64 is not a multiple of "
                                         "llama.attention.head_count=3"),
    # 2**40 positions: a 7 TiB RoPE table at start-up, and a CPU pool of two of them.
    ({L + "context_length": (2**40, T.UINT64)}, "max_context=1,099,511,627,776 is more than"),
    ({"general.architecture": (b"\xff", T.STRING)}, "cannot read GGUF metadata "
                                                    "'general.architecture'"),
    ({TOK + "tokens": ([1, 2, 3], T.ARRAY)}, "'tokenizer.ggml.tokens' must be an array of str"),
    ({TOK + "merges": ([1, 2], T.ARRAY)}, "'tokenizer.ggml.merges' must be an array of str"),
    ({TOK + "merges": (["\u4e00 \u4e01"], T.ARRAY)}, "Token `一` out of vocabulary"),
    ({TOK + "token_type": ("x", T.STRING)}, "token_type' must be an array of int"),
    ({TOK + "token_type": ([99] * 272, T.ARRAY)}, "token 0 ('Ā') has type 99"),
    ({TOK + "pre": (5, T.UINT32)}, "'tokenizer.ggml.pre' must be a string, got int 5"),
    ({TOK + "bos_token_id": ("x", T.STRING)}, "bos_token_id must be a whole number"),
    ({TOK + "eos_token_id": (1.5, T.FLOAT32)}, "eos_token_id must be a whole number"),
    ({TOK + "add_bos_token": ("false", T.STRING)}, "add_bos_token must be true or false"),
    ({"tokenizer.chat_template": (5, T.UINT32)}, "chat_template' must be a string, got int"),
])
def test_bad_metadata(tmp_path: Path, meta: dict, message: str) -> None:
    path = tmp_path / "meta.gguf"
    save_gguf(MODEL, path, "F32", meta=meta)
    with pytest.raises(ModelLoadError, match="meta.gguf") as exc:
        load(path)
    assert message in str(exc.value)


@pytest.mark.parametrize("name, value, message", [
    ("token_embd.weight", np.full((272, 64), np.nan, np.float32),
     "tensor token_embd.weight holds 17,408 NaN or infinite values"),
    ("output_norm.weight", np.array([1.0] * 63 + [np.inf], np.float32),
     "tensor output_norm.weight holds 1 NaN or infinite values"),
    ("blk.0.ffn_up.weight", np.zeros((128, 64), np.int32), "has type I32"),
    ("blk.1.attn_k.weight", np.zeros((16, 64), np.float32), "has shape (16, 64), expected "
                                                            "(32, 64)"),
    ("blk.1.ffn_down.weight", None, "tensor blk.1.ffn_down.weight is missing"),
])
def test_bad_tensors(tmp_path: Path, name: str, value: np.ndarray | None,
                     message: str) -> None:
    path = tmp_path / "tensors.gguf"
    save_gguf(MODEL, path, "F32", tensors={name: value})
    with pytest.raises(ModelLoadError, match="tensors.gguf") as exc:
        load(path)
    assert message in str(exc.value)


def test_the_tiny_model_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "ok.gguf"
    save_gguf(MODEL, path, "F32")
    load(path)
