"""Load a model by name or path into host weights + tokenizer (no backend yet)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crucible.errors import ConfigError, ModelLoadError
from crucible.model.config import ModelConfig
from crucible.model.fetch import resolve_model_path
from crucible.model.weights import WEIGHT_MODES, ModelWeights


@dataclass(frozen=True)
class LoadedModel:
    name: str
    config: ModelConfig
    weights: ModelWeights
    tokenizer: Any  # crucible.model.tokenizer.Tokenizer
    fingerprint: str  # sha256 over config + source weights
    weights_mode: str  # "int8" or "f32": how backends run the linear layers


def check_weights_mode(mode: str) -> str:
    if mode not in WEIGHT_MODES:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHT_MODES)}; got {mode!r}")
    return mode


def load_model(spec: str, weights: str = "int8", cache: Path | None = None) -> LoadedModel:
    """``spec``: a known model name, a ``.gguf`` path or an HF-format directory; ``cache``:
    where known models are downloaded to (model/fetch.py)."""
    from crucible.model.tokenizer_load import load_gguf_tokenizer, load_hf_tokenizer

    check_weights_mode(weights)
    path = resolve_model_path(spec, cache)
    if path.is_dir():
        from crucible.model.hf_loader import load_hf_dir

        cfg, w, fp = load_hf_dir(path)
        tok = load_hf_tokenizer(path)
    else:
        from crucible.model.gguf_loader import load_gguf, open_gguf

        reader = open_gguf(path)  # parsing metadata is slow: read it once for both
        cfg, w, fp = load_gguf(path, reader)
        tok = load_gguf_tokenizer(path, reader)
    if tok.vocab_size > cfg.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's "
                             f"vocabulary is {cfg.vocab_size}")
    return LoadedModel(name=spec if not Path(spec).exists() else Path(spec).name, config=cfg,
                       weights=w, tokenizer=tok, fingerprint=fp, weights_mode=weights)
