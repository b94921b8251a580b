"""Load an HF-format Llama checkpoint: config.json + *.safetensors (+ tokenizer.json).

F32 and F16 tensors load through the ``safetensors`` package; BF16 (which numpy lacks) is
widened to f32 from the raw bytes, located through the file's JSON header.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

from crucible.errors import ModelLoadError
from crucible.model.config import ModelConfig
from crucible.model.layout import (
    HF_EMBED,
    HF_FINAL_NORM,
    HF_LAYER,
    HF_LM_HEAD,
    hf_prefix,
    read_layers,
)
from crucible.model.weights import ModelWeights


def config_from_hf(path: Path) -> ModelConfig:
    cfg_path = path / "config.json"
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{cfg_path}: unreadable config ({exc})") from exc
    if raw.get("model_type", "llama") != "llama":
        raise ModelLoadError(f"{cfg_path}: model_type {raw.get('model_type')!r} is not supported "
                             "(only 'llama')")
    try:
        n_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        cfg = ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            n_layers=int(raw["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
            head_dim=int(raw.get("head_dim") or hidden // n_heads),
            ffn_size=int(raw["intermediate_size"]),
            max_context=int(raw.get("max_position_embeddings", 2048)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{cfg_path}: missing or bad field: {exc}") from exc
    cfg.validate(str(cfg_path))
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


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors files")
    out: dict[str, np.ndarray] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    try:
                        out[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
                    except (TypeError, ValueError):
                        out[name] = _read_bf16(file, name)
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
