"""Load a Llama-architecture GGUF: metadata -> ModelConfig, tensors -> f32 ModelWeights.

Dequantization uses the ``gguf`` package (Q4_1, Q8_0, F16 and F32 are accepted; anything
else is refused with the tensor's name). llama.cpp stores Q and K rows permuted for its
interleaved RoPE; we undo that so every checkpoint reaches the transformer in HF order.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from crucible.errors import ModelLoadError
from crucible.model.config import ModelConfig, real_number, whole_number
from crucible.model.gguf_scan import check_gguf_layout
from crucible.model.layout import (
    GGUF_EMBED,
    GGUF_FINAL_NORM,
    GGUF_LAYER,
    GGUF_LM_HEAD,
    gguf_prefix,
    qk_heads,
    read_layers,
)
from crucible.model.weights import ModelWeights, check_finite, unpermute_llama_qk

SUPPORTED_TYPES = ("F32", "F16", "Q8_0", "Q4_1")


def open_gguf(path: Path) -> Any:
    """Open a GGUF with a clear error for missing, truncated or non-GGUF files."""
    import gguf

    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    check_gguf_layout(path)  # the reader trusts the file's counts (gguf_scan.py)
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/IndexError/struct errors
        raise ModelLoadError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def field_value(reader: Any, key: str, default: Any = None, *, source: Path | None = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is None and source is not None:
            raise ModelLoadError(f"{source}: GGUF metadata key {key!r} is missing")
        return default
    try:
        return f.contents()
    except Exception as exc:  # e.g. a string that is not UTF-8
        raise ModelLoadError(f"{source or 'GGUF'}: cannot read GGUF metadata {key!r}: "
                             f"{exc}") from exc


def config_from_gguf(reader: Any, path: Path) -> ModelConfig:
    arch = field_value(reader, "general.architecture", source=path)
    if arch != "llama":
        raise ModelLoadError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    p, src = "llama.", str(path)

    def whole(key: str, default: Any = None) -> int:
        return whole_number(src, p + key, field_value(reader, p + key, default, source=path))

    def real(key: str, default: float) -> float:
        return real_number(src, p + key, field_value(reader, p + key, default, source=path))

    hidden = whole("embedding_length")
    n_heads = whole("attention.head_count")
    if reader.fields.get(p + "rope.dimension_count") is not None:
        head_dim = whole("rope.dimension_count")
    elif n_heads > 0 and hidden % n_heads == 0:
        head_dim = hidden // n_heads
    else:  # a truncated quotient would surface as a puzzling shape error on attn_q
        raise ModelLoadError(f"{path}: {p}embedding_length={hidden} is not a multiple of "
                             f"{p}attention.head_count={n_heads}, and {p}rope.dimension_count "
                             "(the head size) is not given")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    cfg = ModelConfig(
        vocab_size=whole("vocab_size", len(tokens.data) if tokens is not None else None),
        hidden_size=hidden,
        n_layers=whole("block_count"),
        n_heads=n_heads,
        n_kv_heads=whole("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        ffn_size=whole("feed_forward_length"),
        max_context=whole("context_length"),
        rope_theta=real("rope.freq_base", 10000.0),
        rms_eps=real("attention.layer_norm_rms_epsilon", 1e-5),
        tie_embeddings="output.weight" not in names,
    )
    cfg.validate(src)
    return cfg


def _dequantize(t: Any, path: Path) -> np.ndarray:
    import gguf

    kind = t.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ModelLoadError(f"{path}: tensor {t.name} has type {kind}; supported: "
                             + ", ".join(SUPPORTED_TYPES))
    try:
        out = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    except Exception as exc:
        raise ModelLoadError(f"{path}: tensor {t.name} cannot be dequantized: {exc}") from exc
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists ne0 first
    if out.size != int(np.prod(shape)):
        raise ModelLoadError(f"{path}: tensor {t.name} holds {out.size} values, shape says {shape}")
    out = np.ascontiguousarray(out.reshape(shape), dtype=np.float32)
    check_finite(out, t.name, path)
    return out


def load_gguf(path: Path, reader: Any = None) -> tuple[ModelConfig, ModelWeights, str]:
    """Return (config, f32 weights, fingerprint) for a GGUF file (``reader``: already open)."""
    reader = reader if reader is not None else open_gguf(path)
    cfg = config_from_gguf(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    digest = hashlib.sha256(cfg.to_json().encode())

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{path}: tensor {name} is missing")
        arr = _dequantize(t, path)
        if arr.shape != shape:
            raise ModelLoadError(f"{path}: tensor {name} has shape {arr.shape}, expected {shape}")
        digest.update(name.encode())
        digest.update(np.asarray(t.data).tobytes())
        return arr

    d, heads = cfg.hidden_size, qk_heads(cfg)
    embed = get(GGUF_EMBED, (cfg.vocab_size, d))
    layers = read_layers(cfg, get, GGUF_LAYER, gguf_prefix,
                         lambda f, a: unpermute_llama_qk(a, heads[f]) if f in heads else a)
    final_norm = get(GGUF_FINAL_NORM, (d,))
    lm_head = None if cfg.tie_embeddings else get(GGUF_LM_HEAD, (cfg.vocab_size, d))
    weights = ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)
    return cfg, weights, digest.hexdigest()
