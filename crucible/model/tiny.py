"""Tiny random Llama models for tests and CPU experiments (no download, fast).

Weights come from a seeded generator, so the same arguments give the same model bit for
bit. The default geometry has GQA (4 query heads over 2 KV heads) and the tiny byte-level
tokenizer (272 tokens). ``save_hf_dir`` / ``save_gguf`` write the same model in both
checkpoint formats so loaders can be checked against each other.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from crucible.model.config import ModelConfig
from crucible.model.layout import (
    HF_EMBED,
    HF_FINAL_NORM,
    HF_LAYER,
    HF_LM_HEAD,
    LAYER_FIELDS,
    hf_prefix,
)
from crucible.model.loader import LoadedModel, check_weights_mode
from crucible.model.weights import LayerWeights, ModelWeights


def tiny_config(**geometry: object) -> ModelConfig:
    from crucible.model.tiny_tokenizer import TINY_VOCAB_SIZE

    base = dict(vocab_size=TINY_VOCAB_SIZE, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                head_dim=16, ffn_size=128, max_context=512, rope_theta=10000.0, rms_eps=1e-5,
                tie_embeddings=True)
    base.update(geometry)
    cfg = ModelConfig(**base)  # type: ignore[arg-type]
    cfg.validate("tiny model")
    return cfg


def tiny_weights(cfg: ModelConfig, seed: int = 0) -> ModelWeights:
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        # Large enough that attention is far from uniform and logits spread out.
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.ffn_size
    layers = tuple(
        LayerWeights(attn_norm=norm(d), wq=mat(cfg.n_heads * hd, d, 2.0),
                     wk=mat(cfg.n_kv_heads * hd, d, 2.0), wv=mat(cfg.n_kv_heads * hd, d),
                     wo=mat(d, cfg.n_heads * hd), ffn_norm=norm(d), w_gate=mat(f, d),
                     w_up=mat(f, d), w_down=mat(d, f))
        for _ in range(cfg.n_layers))
    embed = rng.standard_normal((cfg.vocab_size, d)).astype(np.float32)
    lm_head = None if cfg.tie_embeddings else mat(cfg.vocab_size, d)
    return ModelWeights(embed=embed, layers=layers, final_norm=norm(d), lm_head=lm_head)


def tiny_random_model(seed: int = 0, weights: str = "f32", **geometry: object) -> LoadedModel:
    from crucible.model.tiny_tokenizer import tiny_tokenizer

    check_weights_mode(weights)
    cfg = tiny_config(**geometry)
    w = tiny_weights(cfg, seed)
    fp = hashlib.sha256(f"tiny:{seed}:{cfg.to_json()}".encode()).hexdigest()
    return LoadedModel(name=f"tiny-random-{seed}", config=cfg, weights=w,
                       tokenizer=tiny_tokenizer(), fingerprint=fp, weights_mode=weights)


def save_hf_dir(model: LoadedModel, path: Path) -> None:
    """Write config.json + model.safetensors (HF Llama names) for ``model``."""
    from safetensors.numpy import save_file

    cfg, w = model.config, model.weights
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_size, "max_position_embeddings": cfg.max_context,
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_eps,
        "tie_word_embeddings": cfg.tie_embeddings}))
    tensors = {HF_EMBED: w.embed, HF_FINAL_NORM: w.final_norm}
    if w.lm_head is not None:
        tensors[HF_LM_HEAD] = w.lm_head
    for i, lw in enumerate(w.layers):
        for field in LAYER_FIELDS:
            tensors[hf_prefix(i) + HF_LAYER[field]] = np.ascontiguousarray(getattr(lw, field))
    save_file(tensors, str(path / "model.safetensors"))
    model.tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": model.tokenizer.id_to_token(model.tokenizer.bos_token_id),
        "eos_token": model.tokenizer.id_to_token(model.tokenizer.eos_token_id),
        "add_bos_token": False}))
