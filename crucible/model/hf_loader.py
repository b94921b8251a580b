"""Load an HF-format Llama checkpoint: config.json + *.safetensors (+ tokenizer.json).

F32 and F16 tensors load through the ``safetensors`` package; BF16 (which numpy lacks) is
widened to f32 from the raw bytes, located through the file's JSON header.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from crucible.errors import ModelLoadError
from crucible.model.config import ModelConfig, flag, real_number, whole_number
from crucible.model.layout import (
    HF_EMBED,
    HF_FINAL_NORM,
    HF_LAYER,
    HF_LM_HEAD,
    hf_prefix,
    read_layers,
)
from crucible.model.weights import ModelWeights, check_finite


def config_from_hf(path: Path) -> ModelConfig:
    cfg_path = path / "config.json"
    src = str(cfg_path)
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{cfg_path}: unreadable config ({exc})") from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{cfg_path}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("model_type", "llama") != "llama":
        raise ModelLoadError(f"{cfg_path}: model_type {raw.get('model_type')!r} is not supported "
                             "(only 'llama')")

    def whole(key: str, default: Any = None) -> int:
        value = raw.get(key, default)
        if value is None:
            raise ModelLoadError(f"{cfg_path}: {key} is missing")
        return whole_number(src, key, value)

    def real(key: str, default: float) -> float:
        return real_number(src, key, raw.get(key, default))

    n_heads, hidden = whole("num_attention_heads"), whole("hidden_size")
    if raw.get("head_dim") is not None:
        head_dim = whole("head_dim")
    elif n_heads > 0 and hidden % n_heads == 0:
        head_dim = hidden // n_heads
    else:  # a truncated quotient would surface as a puzzling shape error on q_proj
        raise ModelLoadError(f"{cfg_path}: hidden_size={hidden} is not a multiple of "
                             f"num_attention_heads={n_heads}, and head_dim is not given")
    kv = raw.get("num_key_value_heads")
    cfg = ModelConfig(
        vocab_size=whole("vocab_size"),
        hidden_size=hidden,
        n_layers=whole("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_heads if kv is None else whole_number(src, "num_key_value_heads", kv),
        head_dim=head_dim,
        ffn_size=whole("intermediate_size"),
        max_context=whole("max_position_embeddings", 2048),
        rope_theta=real("rope_theta", 10000.0),
        rms_eps=real("rms_norm_eps", 1e-6),
        tie_embeddings=flag(src, "tie_word_embeddings", raw.get("tie_word_embeddings", False)),
    )
    cfg.validate(src)
    return cfg


def _read_bf16(file: Path, name: str) -> np.ndarray:
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        info = header[name]
        start, end = info["data_offsets"]
        f.seek(8 + n + start)
        raw = np.frombuffer(f.read(end - start), dtype=np.uint16)
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # safetensors dtype names


def _tensor(f: Any, file: Path, name: str) -> np.ndarray:
    """One tensor as f32; integer, boolean or 8-bit float weights are refused by name (an
    int tensor would otherwise be cast to f32 without a word, an F8 one misread as BF16)."""
    dtype = f.get_slice(name).get_dtype()
    if dtype not in FLOAT_DTYPES:
        raise ModelLoadError(f"{file}: tensor {name} has dtype {dtype}; supported: "
                             + ", ".join(FLOAT_DTYPES))
    arr = _read_bf16(file, name) if dtype == "BF16" else \
        np.asarray(f.get_tensor(name), dtype=np.float32)
    check_finite(arr, name, file)
    return arr


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors files")
    out: dict[str, np.ndarray] = {}
    seen: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    if name in seen:  # which copy wins would depend on file names
                        raise ModelLoadError(f"{path}: tensor {name} is in both "
                                             f"{seen[name].name} and {file.name}")
                    seen[name] = file
                    out[name] = _tensor(f, file, name)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"{file}: unreadable safetensors file ({exc})") from exc
    return out


def load_hf_dir(path: Path) -> tuple[ModelConfig, ModelWeights, str]:
    cfg = config_from_hf(path)
    tensors = read_safetensors(path)
    digest = hashlib.sha256(cfg.to_json().encode())

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        arr = tensors.get(name)
        if arr is None:
            raise ModelLoadError(f"{path}: tensor {name} is missing")
        if arr.shape != shape:
            raise ModelLoadError(f"{path}: tensor {name} has shape {arr.shape}, expected {shape}")
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(arr).tobytes())
        return np.ascontiguousarray(arr, dtype=np.float32)

    d = cfg.hidden_size
    layers = read_layers(cfg, get, HF_LAYER, hf_prefix)
    embed = get(HF_EMBED, (cfg.vocab_size, d))
    lm_head = None if cfg.tie_embeddings else get(HF_LM_HEAD, (cfg.vocab_size, d))
    weights = ModelWeights(embed=embed, layers=layers, final_norm=get(HF_FINAL_NORM, (d,)),
                           lm_head=lm_head)
    return cfg, weights, digest.hexdigest()
