"""GGUF loading: the default model's metadata and shapes, hand-decoded blocks, round trips."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.step.batch import SegmentSpec, build_packed_batch
from crucible.model.gguf_loader import load_gguf, open_gguf
from gguf_writer import save_gguf
from crucible.model.loader import load_model
from crucible.engine.runner import ModelRunner
from crucible.model.tiny import save_hf_dir, tiny_random_model
from crucible.model.weights import permute_llama_qk, unpermute_llama_qk


def _decode_q8_0(raw: bytes) -> np.ndarray:
    """Q8_0 block, by hand: f16 scale d, then 32 int8 values; x = d * q."""
    d = np.frombuffer(raw[:2], dtype="<f2")[0].astype(np.float32)
    return d * np.frombuffer(raw[2:34], dtype=np.int8).astype(np.float32)


def _decode_q4_1(raw: bytes) -> np.ndarray:
    """Q4_1 block, by hand: f16 scale d, f16 min m, 16 bytes of nibbles; x = d * q + m.

    Low nibbles are elements 0..15, high nibbles elements 16..31.
    """
    d = np.frombuffer(raw[:2], dtype="<f2")[0].astype(np.float32)
    m = np.frombuffer(raw[2:4], dtype="<f2")[0].astype(np.float32)
    qs = np.frombuffer(raw[4:20], dtype=np.uint8)
    q = np.concatenate([qs & 0x0F, qs >> 4]).astype(np.float32)
    return d * q + m


@pytest.mark.model
def test_default_gguf_metadata_and_shapes(default_model_path) -> None:
    cfg, w, fp = load_gguf(default_model_path)
    assert (cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == \
        (30, 576, 9, 3, 64)
    assert (cfg.ffn_size, cfg.vocab_size, cfg.max_context) == (1536, 49152, 8192)
    assert cfg.rope_theta == 100000.0 and abs(cfg.rms_eps - 1e-5) < 1e-9 and cfg.tie_embeddings
    assert w.embed.shape == (49152, 576) and w.lm_head is None
    lw = w.layers[29]
    assert lw.wq.shape == (576, 576) and lw.wk.shape == (192, 576) and lw.w_down.shape == (576, 1536)
    assert len(fp) == 64 and fp == load_gguf(default_model_path)[2]


@pytest.mark.model
def test_dequantized_blocks_match_hand_decoding(default_model_path) -> None:
    reader = open_gguf(default_model_path)
    tensors = {t.name: t for t in reader.tensors}
    cfg, w, _ = load_gguf(default_model_path, reader)
    emb = tensors["token_embd.weight"]  # Q8_0: 34-byte blocks of 32
    assert emb.tensor_type.name == "Q8_0"
    raw = np.asarray(emb.data)
    for row, block in [(0, 0), (1234, 5), (49151, 17)]:
        got = w.embed[row, block * 32 : block * 32 + 32]
        want = _decode_q8_0(raw[row, block * 34 : block * 34 + 34].tobytes())
        assert np.array_equal(got, want)
    down = tensors["blk.3.ffn_down.weight"]  # Q4_1: 20-byte blocks of 32, rows of 1536
    assert down.tensor_type.name == "Q4_1"
    raw = np.asarray(down.data)
    for row, block in [(0, 0), (100, 7), (575, 47)]:
        got = w.layers[3].w_down[row, block * 32 : block * 32 + 32]
        want = _decode_q4_1(raw[row, block * 20 : block * 20 + 20].tobytes())
        assert np.array_equal(got, want)
    # Q rows come back un-permuted: re-permuting gives the file's order.
    q = tensors["blk.0.attn_q.weight"]
    from gguf.quants import dequantize

    file_rows = dequantize(np.asarray(q.data), q.tensor_type).reshape(576, 576)
    assert np.array_equal(permute_llama_qk(w.layers[0].wq, 9), file_rows)


def test_qk_permutation_round_trip() -> None:
    x = np.arange(8 * 4 * 3, dtype=np.float32).reshape(24, 4)
    assert np.array_equal(unpermute_llama_qk(permute_llama_qk(x, 3), 3), x)
    assert not np.array_equal(permute_llama_qk(x, 3), x)


@pytest.mark.parametrize("linear_type", ["F32", "F16"])
def test_gguf_and_hf_checkpoints_give_the_same_logits(tmp_path, linear_type: str) -> None:
    src = tiny_random_model(seed=7)
    save_hf_dir(src, tmp_path / "hf")
    save_gguf(src, tmp_path / "m.gguf", linear_type)
    hf = load_model(str(tmp_path / "hf"), "f32")
    gg = load_model(str(tmp_path / "m.gguf"), "f32")
    tokens = hf.tokenizer.encode("the quick brown fox jumps over the lazy dog")
    assert tokens == gg.tokenizer.encode("the quick brown fox jumps over the lazy dog")
    batch = build_packed_batch([SegmentSpec("r", tokens, 0, [3, 1, 2], list(range(len(tokens))))])
    a = ModelRunner(hf, num_pages=4).forward(batch)
    b = ModelRunner(gg, num_pages=4).forward(batch)
    if linear_type == "F32":
        assert np.array_equal(a, b)
    else:  # f16 storage rounds the weights; logits stay close
        assert 0 < np.abs(a - b).max() < 1e-2 * np.abs(a).max()
